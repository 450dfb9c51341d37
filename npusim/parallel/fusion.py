"""Operator fusion as a graph rewrite: which ops a plan's fusion switches join, and the ops an unfused pipeline adds.

A fused group runs as one launch (its members back to back on the stream, only the first paying the launch) whose
intermediate tensors stay on chip: a member whose activation input another member produced reads it from L2, and a
member whose output only other members consume writes it to L2. Outputs that leave the group go to HBM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from npusim.graph.ops import Op, vector
from npusim.spec.plan import Fusion


@dataclass(frozen=True)
class FusedGroup:
    switch: str  # the Fusion field that turns it on
    members: tuple[str, ...]  # op names, in graph order
    internal_inputs: tuple[str, ...]  # members whose activation input another member produced
    outputs: tuple[str, ...]  # members whose output leaves the group (or is persistent state, e.g. a cache)


# Members as the V3.x graph names them (the CANN MlaProlog / indexer-prolog fused operators, models.md §3.4);
# a model without some of them fuses the ones it has.
GROUPS = (
    FusedGroup("mla_prolog",
               ("attn_norm", "q_a_proj", "q_norm", "q_b_proj", "kv_a_proj", "kv_norm", "rope", "kv_cache_update"),
               ("q_a_proj", "q_norm", "q_b_proj", "kv_a_proj", "kv_norm", "rope", "kv_cache_update"),
               ("attn_norm", "q_b_proj", "rope", "kv_cache_update")),
    FusedGroup("indexer_prolog",
               ("idx_q_b_proj", "idx_k_proj", "idx_k_norm", "idx_rope", "idx_hadamard", "idx_weights_proj",
                "indexer_cache_update"),
               ("idx_k_norm", "idx_rope", "idx_hadamard", "indexer_cache_update"),
               ("idx_hadamard", "idx_weights_proj", "indexer_cache_update")),
)


@dataclass(frozen=True)
class Placement:
    """Where one op sits in the fused graph: its group ('' = alone) and which of its tensors stay on chip."""

    group: str = ""
    first: bool = True  # pays the launch
    input_on_chip: bool = False
    output_on_chip: bool = False


def placements(names: list[str], fusion: Fusion) -> dict[str, Placement]:
    """Per op name, its placement under the plan's fusion switches (ops in no active group are absent)."""
    out: dict[str, Placement] = {}
    for g in GROUPS:
        present = [m for m in g.members if m in names]
        if not getattr(fusion, g.switch) or len(present) < 2:
            continue
        for i, m in enumerate(present):
            out[m] = Placement(g.switch, i == 0, m in g.internal_inputs, m not in g.outputs)
    if fusion.moe_gating_dispatch and "moe_gate" in names:
        out["moe_gate"] = Placement("moe_gating_dispatch", True, False, True)  # routing goes to the dispatch on chip
    return out


def unfused_topk(indexer: Op) -> Op:
    """The top-k of an indexer that does not select in-kernel: its fp32 scores (one per query-key pair) are written
    to HBM and read back by a separate selection kernel; both transfers are charged to this op. Two vector
    operations per score (estimate: one compare-and-select pass of a radix/threshold select)."""
    s = indexer.shape
    pairs = s["pairs"]
    indices = 4.0 * s["tokens"] * s["topk"]
    return dataclasses.replace(vector("indexer_topk", "topk", {"tokens": s["tokens"], "pairs": pairs, "topk": s["topk"]},
                                      read=4.0 * pairs, written=4.0 * pairs + indices, flops=2.0 * pairs),
                               dtypes={"x": "fp32"})
