"""What a kernel finds in L2 when it starts: the state the previous launches left.

A trace's `hit` fractions are the kernel's own reuse (a K tile re-read by another core, a workspace read back): its
inputs otherwise come from HBM, as they do inside a model step, where the kernels before it have moved other data
through L2 (cold). A microbenchmark replay runs the same launch over and over on the same tensors: once its
footprint (the unique bytes it reads and writes, `Trace.hbm_bytes`) fits in L2, every GM access of a repeat hits L2
(warm) and the launch moves nothing through HBM. kernels.md's MSM-GAP pairs measure both for the same shapes on an
A3 die (K216: a 1548-row embedding gather, 44 MB in and out in 18.8 us, 2.4 TB/s, faster than HBM allows).

Inside a model step (`carried`): a kernel's activation input is the output its predecessor on the stream just
wrote through the write-back L2. It is still resident when the predecessor's footprint (the bytes it moved through
HBM: weights, activations, workspaces) fits L2, and the consumer then reads it from L2 (its weights stay cold: the
rest of the step passes through L2 before the next step reads them again); a predecessor that touched more than L2
has evicted its own early output, and the consumer starts cold. An input that a collective delivered is cold (the
peers' writes land in the window buffer, not in this die's L2 by any measurement we have).

Limits: the residency is all or nothing (a footprint above L2 is cold throughout; LRU under a partial fit, the
other agents sharing L2, the set associativity are not modelled).
"""

from __future__ import annotations

import dataclasses

from npusim.kernels.trace import Loop, Node, Trace
from npusim.spec.chip import Chip

L2_STATES = ("cold", "warm")


def resident(trace: Trace, chip: Chip) -> bool:
    """A replay of the trace keeps its footprint in L2 (the test a step's carried output passes, on its own bytes)."""
    return carried(trace.hbm_bytes, chip)


def warm(trace: Trace, chip: Chip) -> Trace:
    """The trace as a warm replay runs it: every GM read and write an L2 hit and its compulsory traffic through L2
    instead of HBM (the roofline's `l2` term), when its footprint fits L2; else unchanged."""
    if not resident(trace, chip):
        return trace

    def body(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(dataclasses.replace(n, body=body(n.body)) if isinstance(n, Loop)
                     else dataclasses.replace(n, hit=1.0) if "gm" in (n.src, n.dst) else n for n in nodes)

    groups = tuple(dataclasses.replace(g, aic=g.aic and dataclasses.replace(g.aic, body=body(g.aic.body)),
                                       aiv=tuple(dataclasses.replace(p, body=body(p.body)) for p in g.aiv))
                   for g in trace.groups)
    return dataclasses.replace(trace, groups=groups, hbm_bytes=0.0, l2_bytes=trace.hbm_bytes + trace.l2_bytes,
                               tiling={**trace.tiling, "l2": "warm"})


def carried(producer_hbm_bytes: float, chip: Chip) -> bool:
    """Whether the output of a kernel that moved `producer_hbm_bytes` through HBM is still in L2 for the next one."""
    return producer_hbm_bytes <= chip.l2.size


def at_launch(trace: Trace, chip: Chip, state: str) -> Trace:
    """The trace with L2 in `state` at its launch (cold: as written)."""
    return warm(trace, chip) if state == "warm" else trace
