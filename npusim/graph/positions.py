"""Which keys the queries of one step see, summed in closed form (a 1M-token prefill must not loop in Python).

A query is described by x = the number of tokens it may attend to, itself included (position t sees x = t + 1).
Prefill of S tokens has x = 1..S per sequence; a decode step of 1 + MTP tokens at context C has x = C..C + MTP.
"""

from __future__ import annotations

from dataclasses import dataclass


def prefix_min(n: int, cap: int | None = None) -> int:
    """sum_{x=1..n} min(x, cap); no cap when cap is None."""
    if n <= 0:
        return 0
    if cap is None or n <= cap:
        return n * (n + 1) // 2
    return cap * (cap + 1) // 2 + (n - cap) * cap


def prefix_floor(n: int, ratio: int, cap: int | None = None) -> int:
    """sum_{x=1..n} min(floor(x / ratio), cap): compressed entries visible to each query (top-k capped)."""
    if n <= 0:
        return 0
    if cap is not None and n >= cap * ratio:
        return prefix_floor(cap * ratio - 1, ratio) + (n - cap * ratio + 1) * cap
    q, rem = divmod(n, ratio)
    return ratio * q * (q - 1) // 2 + q * (rem + 1)


@dataclass(frozen=True, kw_only=True)
class Queries:
    """The new tokens of one step: `batch` sequences, each with `per_seq` queries seeing x = first..last keys."""

    batch: int
    first: int
    per_seq: int

    @property
    def tokens(self) -> int:
        return self.batch * self.per_seq

    @property
    def last(self) -> int:
        """Keys visible to the last query = cache length of a sequence after this step."""
        return self.first + self.per_seq - 1

    def pairs(self, cap: int | None = None) -> int:
        """Query-key pairs, each query seeing min(x, cap) keys (dense attention: cap None; DSA: top-k; SWA: window)."""
        return self.batch * (prefix_min(self.last, cap) - prefix_min(self.first - 1, cap))

    def compressed_pairs(self, ratio: int, cap: int | None = None) -> int:
        """Query-entry pairs over a cache compressed by `ratio` (entry i exists once x >= (i + 1) * ratio)."""
        return self.batch * (prefix_floor(self.last, ratio, cap) - prefix_floor(self.first - 1, ratio, cap))

    def new_entries(self, ratio: int) -> int:
        """Compressed entries emitted during this step (one per completed block of `ratio` tokens)."""
        return self.batch * (self.last // ratio - (self.first - 1) // ratio)
