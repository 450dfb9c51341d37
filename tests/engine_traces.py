"""Small hand-written tile traces for the engine tests (the real tilings live in npusim.kernels)."""

from __future__ import annotations

import math

from npusim.kernels.trace import Group, Instr, Loop, Program, Trace


def gemm_like(m: int, n: int, k: int, *, cores: int = 24, bm: int = 128, bn: int = 256, bk: int = 64,
              depth: int = 2, hit: float = 0.5, dtype: str = "fp16", copies_folded: bool = True,
              chip: str = "910b2") -> Trace:
    """A double-buffered GEMM pipeline: MTE2 GM->L1, MTE1 L1->L0A/L0B, CUBE, FIXPIPE L0C->GM.

    Output tiles are dealt round-robin; cores with one tile more and cores with one fewer form two folded groups
    (or one group per core when `copies_folded` is False, to check folding against the unfolded chip).
    """
    size = 2 if dtype in ("fp16", "bf16") else 1
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    steps = math.ceil(k / bk)
    a, b, c = bm * bk * size, bk * bn * size, bm * bn * size
    body = (
        Loop(steps, (
            Instr("mte2", "load_a", bytes=a, src="gm", dst="l1", wait=("l1_free",), hit=hit),
            Instr("mte2", "load_b", bytes=b, src="gm", dst="l1", set=("l1_full",), hit=hit),
            Instr("mte1", "l1_to_l0a", bytes=a, src="l1", dst="l0a", wait=("l1_full", "l0_free")),
            Instr("mte1", "l1_to_l0b", bytes=b, src="l1", dst="l0b", set=("l1_free", "l0_full")),
            Instr("cube", "mmad", bytes=a + b, flops=2.0 * bm * bn * bk, dtype=dtype, src="l0a", dst="l0c",
                  wait=("l0_full",), set=("l0_free",)),
        )),
        Instr("cube", "hand_over_l0c", set=("c_full",)),
        Instr("fixpipe", "store_c", bytes=c, src="l0c", dst="gm", wait=("c_full",), set=("c_free",)),
        Instr("cube", "claim_l0c", wait=("c_free",)),
    )
    flags = {"l1_free": depth, "l0_free": depth, "c_free": 0}
    start = (Instr("cube", "claim_l0c", set=()),)

    def group(count: int, copies: int) -> Group:
        prog = Program("aic", start + (Loop(count, body),))
        return Group(aic=prog, copies=copies, flags=dict(flags))

    base, extra = divmod(tiles, cores)
    plan = [(base + 1, extra), (base, cores - extra)]
    plan = [(t, c) for t, c in plan if t and c]
    if copies_folded:
        groups = tuple(group(t, c) for t, c in plan)
    else:
        groups = tuple(group(t, 1) for t, c in plan for _ in range(c))
    return Trace(kernel="gemm_like", chip=chip, shape={"m": m, "n": n, "k": k}, groups=groups,
                 flops=2.0 * m * n * k, hbm_bytes=float(size * (m * k + k * n + m * n)),
                 buffers={"l1": depth * (a + b), "l0a": depth * a, "l0b": depth * b, "l0c": 4 * bm * bn},
                 tiling={"bm": bm, "bn": bn, "bk": bk, "depth": depth}, dtype=dtype)
