"""Layer 4b: the ops executed by their kernels' tile traces on NumPy arrays (one trace, two executors).

Every function builds its kernel for the given shapes on `chip` (default 910b2), executes the trace with
`npusim.functional.executor.execute`, and returns float64 arrays holding values of the output dtype. Shapes
follow models.md: T query tokens, S keys, H heads, D head dim. Float64 references live in `.reference`.

Semantics are those of DeepSeek's reference inference code (V3.2-Exp after the 2025-11-17 indexer fix, V4-Flash):
fp8 is act_quant's ue8m0 1x128 (fp8amax the plain amax / 448), the MoE gate ranks groups by top-2 with a bias and
by max without, RoPE and the MLA softmax scale come from a config's YaRN keys (`.rotary`), index rows are sets
(-1 pads, a repeat is refused), V4's sparse_attn takes the reference's own lists (`v4_sparse_attn`). Limits: the
kernels keep the Ascend numerics where they differ (the lightning indexer's fp16 head weights W~, the Hadamard's
bf16 matrix entries); the Compressor's decode step pools by the kernel's actions, not a trace.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from npusim.errors import NpusimError
from npusim.functional.executor import execute
from npusim.functional.numerics import INDEX_QUANT, quantize, rnd
from npusim.spec.chip import Chip, load_chip


@lru_cache(maxsize=8)
def _chip(name: str) -> Chip:
    return load_chip(name)


def check_indices(indices: np.ndarray, rows: int, op: str) -> np.ndarray:
    """Sparse-attention index rows as DeepSeek's reference means them: entries in [0, rows) select a key, -1 pads;
    a key repeated in a row is refused (the reference builds its mask with a scatter, so a repeat counts once, while
    a gather would count it twice)."""
    idx = np.asarray(indices)
    if idx.ndim != 2 or not np.issubdtype(idx.dtype, np.integer):
        raise NpusimError(f"{op}: indices must be an integer array [tokens, k], got {idx.dtype} {idx.shape}",
                          field="indices")
    bad = (idx < -1) | (idx >= rows)
    if bad.any():
        t, j = map(int, np.argwhere(bad)[0])
        raise NpusimError(f"{op}: indices[{t}, {j}] = {idx[t, j]} is outside the {rows} rows (-1 pads a row)",
                          field="indices")
    srt = np.sort(idx, 1)
    rep = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if rep.any():
        t, j = map(int, np.argwhere(rep)[0])
        raise NpusimError(f"{op}: indices row {t} selects key {srt[t, j + 1]} twice; each key may appear once per "
                          "row (DeepSeek's scatter mask counts it once), pad with -1", field="indices")
    return idx


def run(kernel, tensors: dict[str, np.ndarray], chip: str | Chip = "910b2") -> dict[str, np.ndarray]:
    """Trace `kernel` on the chip and execute it on `tensors` (outputs must be present, preallocated)."""
    c = _chip(chip) if isinstance(chip, str) else chip
    return execute(kernel.trace(c), tensors)


def gemm(a: np.ndarray, b: np.ndarray, dtype: str = "bf16", out_dtype: str = "bf16", chip: str | Chip = "910b2",
         **tiles: int) -> np.ndarray:
    """a [m, k] @ b [k, n] (or batched [B, m, k] @ [B, k, n]) under a dtype scheme (bf16, fp16, fp32 as the
    reference's fp32 linears (weights_proj(x.float())), int8 W8A8, fp8 = DeepSeek's ue8m0 1x128 / 128x128 blocks,
    fp8amax, mxfp8, mxfp4): operands are quantised as the scheme says, then multiplied by the GEMM trace."""
    from npusim.kernels.gemm import Gemm

    squeeze = a.ndim == 2
    a3, b3 = (a[None], b[None]) if squeeze else (a, b)
    kern = Gemm(a3.shape[1], b3.shape[2], a3.shape[2], a3.shape[0], dtype, out_dtype, **tiles)
    t = {"c": np.zeros((a3.shape[0], a3.shape[1], b3.shape[2])), **_operands(a3, b3, dtype)}
    c = run(kern, t, chip)["c"]
    return c[0] if squeeze else c


def hadamard(x: np.ndarray, chip: str | Chip = "910b2", **tiles: int) -> np.ndarray:
    """The V3.2 indexer's rotate_activation: x [rows, d] (d a power of two) times the orthonormal Sylvester Hadamard
    matrix H_d / sqrt(d), bf16 in and out, executed as the kernel the graph models it with (idx_hadamard: a bf16
    GEMM against the constant matrix, fp32 accumulation). Limit: the matrix entries +-d^-0.5 are stored in bf16
    (d = 128: 5e-5 relative below the fp32 butterflies of fast_hadamard_transform), far inside the bf16 output."""
    rows, d = x.shape
    if d & (d - 1):
        raise NpusimError(f"hadamard: the last dim must be a power of two, got {d}", field="shape")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return gemm(rnd(x, "bf16"), h * d ** -0.5, "bf16", "bf16", chip, **tiles)


def _operands(a3: np.ndarray, b3: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """a [B, m, k] and b [B, k, n] stored as the scheme says: rounded, or quantised with their block scales."""
    from npusim.kernels.gemm import scheme_of

    sch = scheme_of(dtype)
    if not sch.scale:
        return {"a": rnd(a3, sch.elem), "b": rnd(b3, sch.elem)}
    (qa, sa) = quantize(a3, sch.elem, 2, sch.qblock, sch.scale)
    (qb, sb) = quantize(b3, sch.elem, 1, sch.qblock, sch.b_scale or sch.scale, sch.b_block_n)
    return {"a": qa, "sa": sa, "b": qb, "sb": sb}


def quant_matmul(a: np.ndarray, b: np.ndarray, out_dtype: str = "bf16", chip: str | Chip = "910b2",
                 **tiles: int) -> np.ndarray:
    """W8A8: a [m, k] quantised to int8 per token (row), b [k, n] per channel (column), multiplied by the
    quant_matmul trace (int32 on the cube, dequantised on the vector cores) -> [m, n] in out_dtype."""
    from npusim.kernels.quant_matmul import QuantMatmul

    m, k = a.shape
    kern = QuantMatmul(m, b.shape[1], k, out_dtype, **tiles)
    t = {"c": np.zeros((1, m, b.shape[1])), **_operands(a[None], b[None], "int8")}
    return run(kern, t, chip)["c"][0]


def grouped_gemm(a: np.ndarray, b: np.ndarray, counts, dtype: str = "bf16", out_dtype: str = "bf16",
                 chip: str | Chip = "910b2", **tiles: int) -> np.ndarray:
    """MoE experts: a [rows, k] sorted by expert, b [E, k, n], counts [E] rows per expert -> [rows, n] with rows of
    expert e multiplied by b[e] (operands stored as the dtype scheme says, as in `gemm`)."""
    from npusim.kernels.gemm import GroupedGemm

    rows, k = a.shape
    kern = GroupedGemm(rows, k, b.shape[2], b.shape[0], dtype, out_dtype, ",".join(str(int(c)) for c in counts),
                       **tiles)
    t = {"c": np.zeros((1, rows, b.shape[2])), **_operands(a[None], b, dtype)}
    return run(kern, t, chip)["c"][0]


def lightning_indexer(q: np.ndarray, k: np.ndarray, weights: np.ndarray, topk: int, causal: bool = True,
                      dtype: str = "bf16", chip: str | Chip = "910b2", **tiles: int):
    """q [T, H, D], k [S, D], weights [T, H] (scales folded in) -> (scores, indices) [T, topk].

    Queries are the last T positions of the S keys; with `causal`, key s is visible to query t iff
    s <= S - T + t. Indices are sorted by score (ties to the lower index); -1 (score -inf) where fewer than
    topk keys are visible. dtype bf16 rounds q and k to bf16; int8 / fp8 quantise the bf16 q per (token, head) and
    k per key as the indexer cache does (int8: amax scales; fp8: DeepSeek's ue8m0 act_quant, numerics.INDEX_QUANT),
    the query scales folded into the fp16 head weights W~ and the key scales applied on the vector cores
    (models.md §3.4).
    """
    from npusim.kernels.indexer import DEQ, LightningIndexer, SCORE_DT

    T, H, D = q.shape
    S = k.shape[0]
    kern = LightningIndexer(T, S, H, D, topk, 1, int(causal), dtype, **tiles)
    w = np.asarray(weights, np.float64)
    if kern.quantised:
        elem, fmt = INDEX_QUANT[dtype]
        (q8, sq), (k8, sk) = quantize(rnd(q, "bf16"), elem, 2, 0, fmt), quantize(rnd(k, "bf16"), elem, 1, 0, fmt)
        t = {"q": q8.reshape(T * H, D), "k": k8, "w": rnd(w * sq[..., 0] / DEQ, SCORE_DT), "ks": sk.reshape(1, S)}
    else:
        t = {"q": rnd(q.reshape(T * H, D), dtype), "k": rnd(k, dtype), "w": rnd(w, SCORE_DT)}
    out = run(kern, t | {"scores": np.zeros((T, topk)), "indices": np.zeros((T, topk))}, chip)
    return out["scores"], out["indices"].astype(np.int64)


def rmsnorm(x: np.ndarray, weight: np.ndarray, dtype: str = "bf16", chip: str | Chip = "910b2") -> np.ndarray:
    """x [rows, dim] -> x / rms(x) * weight (eps 1e-6, fp32 math, output rounded to dtype)."""
    return _rowwise("rmsnorm", x, weight[None], dtype, chip)


def add_rmsnorm(x: np.ndarray, residual: np.ndarray, weight: np.ndarray, dtype: str = "bf16",
                chip: str | Chip = "910b2") -> tuple[np.ndarray, np.ndarray]:
    """AddRmsNorm: s = x + residual -> (s / rms(s) * weight, s), both rounded to dtype (npu_add_rms_norm's y and x)."""
    from npusim.kernels.rowwise import RowWise

    kern = RowWise(x.shape[0], x.shape[1], "rmsnorm", dtype, residual=1)
    out = run(kern, {"x": rnd(x, dtype), "r": rnd(residual, dtype), "p": weight[None], "y": np.zeros(x.shape),
                     "s": np.zeros(x.shape)}, chip)
    return out["y"], out["s"]


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, dtype: str = "bf16",
              chip: str | Chip = "910b2") -> np.ndarray:
    """x [rows, dim] -> (x - mean) / std * weight + bias (eps 1e-6)."""
    return _rowwise("layernorm", x, np.stack([weight, bias]), dtype, chip)


def _rowwise(op: str, x: np.ndarray, p: np.ndarray, dtype: str, chip) -> np.ndarray:
    from npusim.kernels.rowwise import RowWise

    kern = RowWise(x.shape[0], x.shape[1], op, dtype)
    return run(kern, {"x": rnd(x, dtype), "p": p, "y": np.zeros(x.shape)}, chip)["y"]


def sparse_mla_attention(q: np.ndarray, kv: np.ndarray, indices: np.ndarray, scale: float, d_v: int = 512,
                         causal: bool = True, dtype: str = "bf16", chip: str | Chip = "910b2",
                         **tiles: int) -> np.ndarray:
    """Absorbed MLA over each token's selected rows (models.md §1.4): q [T, H, 576], kv [S, 576] (K = kv,
    V = kv[:, :d_v]), indices [T, k] into kv (-1 = none) -> [T, H, d_v]. Queries are the last T positions; with
    `causal`, selected keys after the query are dropped too. DeepSeek's scale is the MLA head's, not the 576-dim
    query's: `npusim.functional.rotary.mla_softmax_scale(config)` (V3.2: 192^-0.5 mscale^2 ~ 0.1352)."""
    from npusim.kernels.attention import SparseFlashAttention

    T, H, D = q.shape
    indices = check_indices(indices, kv.shape[0], "sparse_mla_attention")
    S, k = kv.shape[0], indices.shape[1]
    kern = SparseFlashAttention(T, S, H, D, d_v, k, causal=int(causal), dtype=dtype, scale=scale, **tiles)
    out = run(kern, {"q": rnd(q.reshape(T * H, D), dtype), "kv": rnd(kv, dtype), "indices": indices,
                     "out": np.zeros((T * H, d_v))}, chip)["out"]
    return out.reshape(T, H, d_v)


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool = True,
                    dtype: str = "bf16", chip: str | Chip = "910b2", **tiles: int) -> np.ndarray:
    """Flash attention: q [T, H, D], k [S, KVH, D], v [S, KVH, Dv] (KVH = 1 for MQA / absorbed MLA, = H for MHA)
    -> [T, H, Dv]; causal with the queries the last T positions."""
    from npusim.kernels.attention import FlashAttention

    T, H, D = q.shape
    S, kvh, dv = v.shape
    kern = FlashAttention(T, S, H, D, dv, kvh, causal=int(causal), dtype=dtype, scale=scale, **tiles)
    order = (1, 2, 0, 3) if kern.head_major else (1, 0, 2, 3)  # kv head, head, token (BNSD) or kv head, token, head
    rows = q.reshape(T, kvh, H // kvh, D).transpose(order).reshape(-1, D)
    t = {"q": rnd(rows, dtype), "k": rnd(k.transpose(1, 0, 2).reshape(-1, D), dtype),
         "v": rnd(v.transpose(1, 0, 2).reshape(-1, dv), dtype), "out": np.zeros((kvh * T * (H // kvh), dv))}
    out = run(kern, t, chip)["out"]
    shape = (kvh, H // kvh, T, dv) if kern.head_major else (kvh, T, H // kvh, dv)
    return out.reshape(shape).transpose(np.argsort(order)).reshape(T, H, dv)


def v4_attention(q: np.ndarray, kv: np.ndarray, sink: np.ndarray, scale: float, window: int = 128, ratio: int = 0,
                 ckv: np.ndarray | None = None, cmp_indices: np.ndarray | None = None, dtype: str = "bf16",
                 chip: str | Chip = "910b2", **tiles: int) -> np.ndarray:
    """DeepSeek-V4 shared-KV attention (models.md §2.2/§2.4): q [T, H, D], raw kv [S, D], per-head sink [H];
    ratio 0 = window only, 128 = HCA over all compressed entries ckv [S//128, D], 4 = CSA over cmp_indices [T, k]
    into ckv (-1 = none) -> [T, H, D]. The kernel is the SFA mechanism with the index set window ++ compressed."""
    from npusim.kernels.attention import V4Attention

    T, H, D = q.shape
    S = kv.shape[0]
    pos = S - T + np.arange(T)
    win = pos[:, None] - window + 1 + np.arange(window)[None]
    idx = [np.where(win >= 0, win, -1)]
    topk = 0
    if ratio:
        n = S // ratio
        if cmp_indices is None:  # HCA: every entry completed before the query
            ent = np.arange(n)[None].repeat(T, 0)
            ent = np.where(ent < ((pos + 1) // ratio)[:, None], ent, -1)
        else:
            ent = check_indices(cmp_indices, S // ratio, "v4_attention")
            topk = ent.shape[1]
        idx.append(np.where(ent >= 0, ent + S, -1))
    rows = np.concatenate([kv, ckv[:S // ratio]]) if ratio else kv
    kern = V4Attention(T, S, H, D, window, ratio, topk, dtype=dtype, scale=scale, **tiles)
    out = run(kern, {"q": rnd(q.reshape(T * H, D), dtype), "kv": rnd(rows, dtype),
                     "indices": np.concatenate(idx, 1), "sink": np.asarray(sink, np.float64)[None],
                     "out": np.zeros((T * H, D))}, chip)["out"]
    return out.reshape(T, H, D)


def v4_sparse_attn(q: np.ndarray, kv: np.ndarray, sink: np.ndarray, topk_idxs: np.ndarray, scale: float,
                   start_pos: int = 0, window: int = 128, ratio: int = 0, dtype: str = "bf16",
                   chip: str | Chip = "910b2", **tiles: int) -> np.ndarray:
    """DeepSeek-V4's sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale) as Attention.forward calls it, through
    the V4 attention trace. Prefill (start_pos 0, T tokens): kv = [raw rows of the T tokens ; compressed entries],
    the window columns (min(T, window) of them) are positions, the compressed ones entry + T. Decode (start_pos > 0,
    one token): kv = [the window ring buffer (row = position % window) ; compressed entries], window columns are
    ring slots, compressed ones entry + window. -1 pads. The kernel reads a token's window as its last `window`
    positions and, HCA, every completed entry: other lists are refused; CSA's compressed columns are its top-k."""
    T = q.shape[0]
    idx = check_indices(topk_idxs, kv.shape[0], "v4_sparse_attn")
    if start_pos and T != 1:
        raise NpusimError(f"v4_sparse_attn: a decode step (start_pos {start_pos}) has one token, got {T}",
                          field="start_pos")
    nwin = window if start_pos else min(T, window)
    offset = window if start_pos else T
    pos = start_pos + np.arange(T)
    keys = start_pos + T
    win = idx[:, :nwin]
    at = np.where(win >= 0, pos[:, None] - (pos[:, None] - win) % window if start_pos else win, -1)
    for t, p in enumerate(pos):
        if set(at[t][at[t] >= 0].tolist()) != set(range(max(0, p - window + 1), p + 1)):
            raise NpusimError(f"v4_sparse_attn: token {t}'s window columns are not the positions "
                              f"{max(0, p - window + 1)}..{p} (the kernel reads the last {window} rows)",
                              field="topk_idxs")
    raw = np.zeros((keys, kv.shape[1]))
    if start_pos:
        live = np.arange(max(0, keys - window), keys)
        raw[live] = kv[live % window]
    else:
        raw[:] = kv[:T]
    if not ratio:
        return v4_attention(q, raw, sink, scale, window, 0, dtype=dtype, chip=chip, **tiles)
    ent = np.where(idx[:, nwin:] >= 0, idx[:, nwin:] - offset, -1)
    ckv = np.zeros((keys // ratio, kv.shape[1]))
    n = min(kv.shape[0] - offset, keys // ratio)
    ckv[:n] = kv[offset:offset + n]
    done = (pos + 1) // ratio
    if ratio != 4:
        for t in range(T):
            if set(ent[t][ent[t] >= 0].tolist()) != set(range(done[t])):
                raise NpusimError(f"v4_sparse_attn: token {t}'s compressed columns are not its {done[t]} completed "
                                  f"entries (HCA attends to all of them)", field="topk_idxs")
        return v4_attention(q, raw, sink, scale, window, ratio, ckv, dtype=dtype, chip=chip, **tiles)
    return v4_attention(q, raw, sink, scale, window, ratio, ckv, np.where(ent < done[:, None], ent, -1),
                        dtype=dtype, chip=chip, **tiles)


from npusim.functional.layer_ops import (CompressorState, cache_update, compressor, compressor_decode,  # noqa: E402
                                         compressor_state, copy, dequant_swiglu_quant, dequantise, embedding, mhc_post,
                                         mhc_pre, moe_combine, moe_gate, moe_permute, quantise, rope, sinkhorn, swiglu)
