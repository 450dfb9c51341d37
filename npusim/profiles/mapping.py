"""Which npusim kernel a profiled op is, with which shape: read from its OP Type and its recorded tensors.

Each rule reads the op's inputs in the order its CANN (aclnn) API declares them and derives the kernel's shape
keys; whatever the row cannot tell (an attribute such as a layout or a sparse mode, the values of a group list)
is either the op's documented default, said in the mapping's note, or a reason to leave the op unmapped. An op
is never mapped onto a kernel that does different work: a fused residual add, a static quantisation or a layout
the row does not record are listed with the reason instead.

Mapped: MatMul / MatMulV2 / MatMulV3 / BatchMatMul(V2, V3) / QuantBatchMatmul(V3, V4) -> gemm, GroupedMatmul ->
grouped_gemm, RmsNorm / LayerNorm(V3, V4) -> rowwise, SwiGlu -> swiglu, DynamicQuant -> quantise,
RotaryPositionEmbedding / InterleaveRope -> rope, LightningIndexer -> lightning_indexer, SparseFlashAttention ->
sparse_flash_attention. Rows without shapes (msprof op's OpBasicInfo) take the shape the user gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from npusim.profiles.msprof import Launch, Tensor

# msprof data type names (DT_ prefix dropped) -> npusim dtype names
DTYPES = {"BF16": "bf16", "BFLOAT16": "bf16", "FLOAT16": "fp16", "FP16": "fp16", "HALF": "fp16", "FLOAT": "fp32",
          "FLOAT32": "fp32", "FP32": "fp32", "INT8": "int8", "INT4": "int4", "INT32": "int32", "INT64": "int64",
          "FLOAT8_E4M3FN": "fp8", "HIFLOAT8": "hif8", "FLOAT8_E8M0": "e8m0", "FLOAT4_E2M1": "fp4", "BOOL": "bool",
          "UINT8": "uint8"}
GEMM_DTYPES = ("bf16", "fp16", "int8", "fp8")  # operand dtypes with a gemm scheme of the same name
OUT_DTYPES = ("bf16", "fp16", "fp32", "int8")
SPARSE_MODE = "sparse_mode is an attribute the profile does not record: the default 3 (causal) taken"


@dataclass(frozen=True)
class Mapping:
    """The op is kernel `kernel` at `shape` (shape keys and options, as `npusim kernel sim --shape` takes them)."""

    kernel: str
    shape: tuple[tuple[str, object], ...]
    note: str = ""

    @property
    def shape_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape)


@dataclass(frozen=True)
class Unmapped:
    reason: str


def dtype(t: Tensor | None) -> str:
    name = (t.dtype if t else "").strip().upper()
    name = name[3:] if name.startswith("DT_") else name
    return DTYPES.get(name, name.lower())


def _present(ts) -> list[Tensor]:
    return [t for t in ts or () if t is not None and t.shape]


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1])


def _mapping(kernel: str, note: str = "", **shape) -> Mapping:
    return Mapping(kernel, tuple(shape.items()), note)


# ------------------------------------------------------------------------------------------------------ rules
def matmul(op: Launch) -> Mapping | Unmapped:
    """x1 [.., m, k] (or [.., k, m] transposed) @ x2 [.., k, n] (or [.., n, k]); the output [.., m, n] decides."""
    ins = _present(op.inputs)
    if len(ins) < 2 or len(ins[0].shape) < 2 or len(ins[1].shape) < 2:
        return Unmapped("needs two matrix inputs in Input Shapes")
    a, b = ins[0], ins[1]
    da, db = dtype(a), dtype(b)
    if da != db or da not in GEMM_DTYPES:
        return Unmapped(f"operands {da} x {db}: npusim's gemm has schemes for equal operand dtypes "
                        f"{', '.join(GEMM_DTYPES)} (weight-only quantisation is not modelled)")
    out = _present(op.outputs)
    dims = _mnk(a.shape, b.shape, out[0].shape if out else None)
    if dims is None:
        return Unmapped(f"shapes {list(a.shape)} x {list(b.shape)} -> "
                        f"{list(out[0].shape) if out else '?'} are not a (batched) matrix product")
    m, n, k = dims
    batch = math.prod(a.shape[:-2]) if len(b.shape) > 2 else 1
    if len(b.shape) == 2:  # a 2-D weight under batched activations: one GEMM of all their rows
        m *= math.prod(a.shape[:-2])
    od = dtype(out[0]) if out else "bf16"
    return _mapping("gemm", "" if out else "no output shape: x2 taken as [k, n] or [n, k] by its sizes",
                    m=m, n=n, k=k, batch=batch, dtype=da, out_dtype=od if od in OUT_DTYPES else "bf16")


def _mnk(a, b, out) -> tuple[int, int, int] | None:
    if out is not None and len(out) >= 2:
        m, n = out[-2], out[-1]
        k = a[-1] if a[-2] == m else a[-2] if a[-1] == m else None
    else:
        m, k = a[-2], a[-1]
        n = b[-1] if b[-2] == k else b[-2] if b[-1] == k else None
    if k is None or n is None or (b[-2], b[-1]) not in ((k, n), (n, k)):
        return None
    return m, n, k


def grouped_matmul(op: Launch) -> Mapping | Unmapped:
    """x [rows, k], weight [experts, k, n] (or [experts, n, k]), ..., group_list [experts] -> y [rows, n]."""
    ins, out = _present(op.inputs), _present(op.outputs)
    if len(ins) < 2 or len(ins[0].shape) != 2 or len(ins[1].shape) != 3 or not out:
        return Unmapped("needs x [rows, k], one stacked weight [experts, k, n] and y [rows, n] (lists of tensors "
                        "per group are not decoded)")
    x, w = ins[0], ins[1]
    rows, k = x.shape
    n = out[0].shape[-1]
    if (w.shape[1], w.shape[2]) not in ((k, n), (n, k)):
        return Unmapped(f"weight {list(w.shape)} does not match x {list(x.shape)} and y {list(out[0].shape)}")
    if dtype(x) != dtype(w) or dtype(x) not in GEMM_DTYPES:
        return Unmapped(f"operands {dtype(x)} x {dtype(w)} have no grouped_gemm scheme")
    od = dtype(out[0])
    return _mapping("grouped_gemm", "group_list values are not in the profile: rows spread evenly over the experts",
                    rows=rows, k=k, n=n, experts=w.shape[0], dtype=dtype(x),
                    out_dtype=od if od in OUT_DTYPES else "bf16")


def row_op(op_name: str) -> Callable[[Launch], Mapping | Unmapped]:
    def rule(op: Launch) -> Mapping | Unmapped:
        """x [.., dim], gamma [dim] (LayerNorm: and beta) -> y [.., dim]."""
        ins = _present(op.inputs)
        if not ins:
            return Unmapped("needs the input x in Input Shapes")
        x = ins[0]
        return _mapping("rowwise", rows=_rows(x.shape), dim=x.shape[-1], op=op_name,
                        dtype=dtype(x) if dtype(x) in ("bf16", "fp16", "fp32") else "bf16")
    return rule


def swiglu(op: Launch) -> Mapping | Unmapped:
    """x [.., 2 w] = [gate | up] -> y [.., w]."""
    ins = _present(op.inputs)
    if not ins or ins[0].shape[-1] % 2:
        return Unmapped("needs x [.., 2 w] in Input Shapes")
    x = ins[0]
    note = "" if dtype(x) == "bf16" else f"npusim's swiglu moves bf16; the op's {dtype(x)} is not modelled"
    return _mapping("swiglu", note, rows=_rows(x.shape), width=x.shape[-1] // 2)


def dynamic_quant(op: Launch) -> Mapping | Unmapped:
    """x [.., d] -> y [.., d] (int8 / fp8) and one fp32 scale per row (per-token)."""
    ins, out = _present(op.inputs), _present(op.outputs)
    if not ins or not out:
        return Unmapped("needs x and y in the shapes")
    q = dtype(out[0])
    if q not in ("int8", "fp8"):
        return Unmapped(f"output {q}: npusim's quantise writes int8, fp8, mxfp8 or mxfp4")
    x = ins[0]
    return _mapping("quantise", rows=_rows(x.shape), elements=x.shape[-1], dtype=q, block=0)


def rope(layout: str, note: str = "") -> Callable[[Launch], Mapping | Unmapped]:
    def rule(op: Launch) -> Mapping | Unmapped:
        """x [.., heads, dim] (BSND; a BNSD x costs the same elements), cos, sin -> y."""
        ins = _present(op.inputs)
        if not ins or len(ins[0].shape) < 3 or ins[0].shape[-1] % 2:
            return Unmapped("needs x [.., heads, dim] in Input Shapes")
        x = ins[0]
        return _mapping("rope", note, tokens=math.prod(x.shape[:-2]), heads=x.shape[-2], dim=x.shape[-1],
                        layout=layout)
    return rule


def lightning_indexer(op: Launch) -> Mapping | Unmapped:
    """query [B, S1, N1, D] (BSND) or [T1, N1, D] (TND), key [B, S2, N2, D] / [T2, N2, D] (PA_BSND: paged blocks),
    weights, actual_seq_lengths_query [B], actual_seq_lengths_key, block_table -> sparse_indices [.., topk]."""
    ins = list(op.inputs or ())
    out = _present(op.outputs)
    if len(ins) < 3 or ins[0] is None or ins[1] is None or not out:
        return Unmapped("needs query, key, weights and sparse_indices in the shapes")
    q, key = ins[0].shape, ins[1].shape
    if len(ins) > 5 and ins[5] is not None and ins[5].shape:
        return Unmapped("paged key cache (block_table given): the key lengths are values of "
                        "actual_seq_lengths_key, which the profile does not record")
    note = SPARSE_MODE
    if len(q) == 4 and len(key) == 4 and key[0] == q[0]:
        batch, tokens, heads, dim, keys = q[0], q[1], q[2], q[3], key[1]
    elif len(q) == 3 and len(key) == 3 and len(ins) > 3 and ins[3] is not None and len(ins[3].shape) == 1:
        batch = ins[3].shape[0]
        tokens, heads, dim, keys = q[0] // batch, q[1], q[2], key[0] // batch
        note += f"; TND: {q[0]} query and {key[0]} key tokens taken as {batch} equal sequences"
    else:
        return Unmapped(f"query {list(q)} and key {list(key)} are neither BSND nor TND with its sequence lengths")
    return _mapping("lightning_indexer", note, batch=batch, tokens=tokens, keys=keys, heads=heads, dim=dim,
                    topk=out[0].shape[-1], dtype=dtype(ins[0]))


def sparse_flash_attention(op: Launch) -> Mapping | Unmapped:
    """query [B, S1, N1, D], key, value [B, S2, N2, D], sparse_indices [B, S1, N2, topk], block_table,
    actual_seq_lengths_query, actual_seq_lengths_kv, query_rope [.., Dr], key_rope (BSND, absorbed MLA)."""
    ins = list(op.inputs or ())
    if len(ins) < 4 or any(t is None or not t.shape for t in ins[:4]):
        return Unmapped("needs query, key, value and sparse_indices in the shapes")
    if len(ins) > 4 and ins[4] is not None and ins[4].shape:
        return Unmapped("paged KV cache (block_table given): the key lengths are values of actual_seq_lengths_kv, "
                        "which the profile does not record")
    q, key, idx = ins[0].shape, ins[1].shape, ins[3].shape
    if len(q) != 4 or len(key) != 4 or key[0] != q[0]:
        return Unmapped(f"query {list(q)} and key {list(key)} are not BSND (TND is not decoded)")
    rope_d = ins[7].shape[-1] if len(ins) > 7 and ins[7] is not None and ins[7].shape else 0
    return _mapping("sparse_flash_attention", SPARSE_MODE,
                    batch=q[0], tokens=q[1], keys=key[1], heads=q[2], d_qk=q[3] + rope_d, d_v=ins[2].shape[-1],
                    topk=idx[-1], dtype=dtype(ins[0]))


LAYOUT = "its layout (input_layout BSH / BSND / BNSD / TND) is an attribute the profile does not record"
GEMM_TYPES = ("matmul", "matmulv2", "matmulv3", "batchmatmul", "batchmatmulv2", "batchmatmulv3", "quantbatchmatmulv3",
              "quantbatchmatmulv4")
RULES: dict[str, tuple[str, Callable[[Launch], Mapping | Unmapped]]] = {  # lower-case OP Type -> (kernel, rule)
    **{t: ("gemm", matmul) for t in GEMM_TYPES},
    "groupedmatmul": ("grouped_gemm", grouped_matmul),
    "rmsnorm": ("rowwise", row_op("rmsnorm")),
    **{t: ("rowwise", row_op("layernorm")) for t in ("layernorm", "layernormv3", "layernormv4")},
    "swiglu": ("swiglu", swiglu),
    "dynamicquant": ("quantise", dynamic_quant),
    "rotarypositionembedding": ("rope", rope("half", "mode is an attribute the profile does not record: the "
                                                     "default (rotate-half) taken")),
    "interleaverope": ("rope", rope("interleaved")),
    "lightningindexer": ("lightning_indexer", lightning_indexer),
    "sparseflashattention": ("sparse_flash_attention", sparse_flash_attention),
}
REASONS = {  # op types npusim has a kernel family for, but not this op's work
    "addrmsnorm": "fuses the residual add (reads x1 and x2, writes x1 + x2 and y): npusim's rowwise norm reads "
                  "and writes one tensor",
    "ascendquantv2": "static quantisation with given scales: npusim's quantise computes per-row scales",
    "weightquantbatchmatmulv2": "weight-only quantisation (bf16 x int8 / int4) has no npusim GEMM scheme",
    **{t: LAYOUT for t in ("fusedinferattentionscore", "flashattentionscore", "incrementalflashattention",
                           "increflashattention", "promptflashattention", "flashattentionscoregrad")},
}
COMMUNICATION = ("communication op: the op summary records neither message size nor group (msprof writes them "
                 "to communication.json)")


def kernel_for(op_type: str) -> str | None:
    """The kernel an OP Type maps onto, if any."""
    return RULES.get(op_type.lower(), (None,))[0]


def map_launch(op: Launch, shape: dict[str, str] | None = None, kernel: str | None = None) -> Mapping | Unmapped:
    """The launch's kernel and shape. A row without shapes (msprof op's OpBasicInfo) takes the user's `shape`
    (npusim shape keys) on `kernel`, or on the kernel its OP Type maps onto."""
    key = op.op_type.lower()
    if key.startswith("hcom_") or op.task_type.upper() in ("HCCL", "COMMUNICATION"):
        return Unmapped(COMMUNICATION)
    if op.inputs is None:
        name = kernel or kernel_for(op.op_type)
        if name is None:
            return Unmapped(f"npusim has no kernel for OP Type {op.op_type}")
        if not shape:
            return Unmapped("the row records no shapes (msprof op's OpBasicInfo, or --task-time l0): give --shape")
        return Mapping(name, tuple(shape.items()), "shape given with --shape")
    if key in REASONS:
        return Unmapped(REASONS[key])
    if key not in RULES:
        return Unmapped(f"npusim has no kernel for OP Type {op.op_type}")
    return RULES[key][1](op)
