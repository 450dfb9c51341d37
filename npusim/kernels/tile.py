"""The functional meaning of a tile instruction (`Instr.action`): which tile of which array it reads and writes.

Actions are symbolic so that a loop-compressed trace stays small: a tile's position is an integer expression of
the loop variables (`Lin`), evaluated only by the functional executor when it unrolls the loops. The engine
ignores actions entirely. Names of arrays say where they live: a GM tensor of the op ("q", "k", "out"), a GM
workspace of one AI core ("ws.*", shared by its AIC and AIVs) or an on-chip buffer of one core (anything else,
e.g. "l1.a", "l0c", "ub.s").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True, slots=True)
class Lin:
    """((base + sum(coef * env[var])) // div) % mod — block coordinates from loop indices (mod 0 = none).

    A term's var may be a tuple of names, standing for their product (e.g. a 0/1 part selector times an offset).
    """

    base: int = 0
    terms: tuple[tuple[str | tuple[str, ...], int], ...] = ()
    div: int = 1
    mod: int = 0

    def __call__(self, env: dict[str, int]) -> int:
        v = self.base
        for var, coef in self.terms:
            v += coef * (env[var] if isinstance(var, str) else math.prod(env[x] for x in var))
        v //= self.div
        return v % self.mod if self.mod else v


@dataclass(frozen=True, slots=True)
class PerCore:
    """A band constant of folded cores that differ in it: values[env['core'] - first] (one value per core of the
    group, whose copies the functional path runs with 'core' bound)."""

    values: tuple[int, ...]
    first: int = 0

    def __call__(self, env: dict[str, int]) -> int:
        return self.values[env["core"] - self.first]


Index = Union[int, Lin, PerCore]


def lin(*terms: tuple[str | tuple[str, ...], int], base: int = 0, div: int = 1, mod: int = 0) -> Lin:
    return Lin(base, tuple(terms), div, mod)


def value(x: Any, env: dict[str, int]) -> Any:
    return x(env) if isinstance(x, (Lin, PerCore)) else x


@dataclass(frozen=True, slots=True)
class Ref:
    """A tile: `size` elements per dim from `start`; reads before 0 or past `stop` (or the array) are padded, writes
    clipped.

    A size of -1 means the whole extent of that dim (a gather source, a vector of per-row scales).
    """

    name: str
    start: tuple[Index, ...]
    size: tuple[int, ...]
    stop: tuple[Index | None, ...] = ()


@dataclass(frozen=True, slots=True)
class Act:
    """`out = op(*ins, **args)` rounded to `dtype`; args may hold `Lin` values (tile positions, valid lengths)."""

    op: str
    out: Ref | None = None
    ins: tuple[Ref, ...] = ()
    dtype: str = "fp32"
    args: tuple[tuple[str, Any], ...] = ()


def let(**bindings: Index) -> Act:
    """Scalar-pipe address arithmetic: binds block coordinates (evaluated in order) for the tiles that follow."""
    return Act("let", args=tuple(bindings.items()))
