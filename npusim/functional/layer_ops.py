"""The ops around attention and the experts, executed by their kernels' tile traces (re-exported by
`npusim.functional`): mHC pre/post and Sinkhorn, MoE gate and combine, the KV Compressor, RoPE, quantise /
dequantise, SwiGLU and W8A8's dequant-SwiGLU-quant, the MoE routing permutations, embedding, row copies / casts.
Shapes follow models.md §1-2; T tokens, n residual streams, d hidden. Limit: the Compressor's decode step runs its
GEMM as a trace and its pooling / norm / RoPE as the kernel's actions on the carried state (the prefill kernel has
no per-token state in GM)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.errors import NpusimError
from npusim.functional.numerics import rnd
from npusim.functional.rotary import Rotary
from npusim.kernels import projection, vector
from npusim.spec.chip import Chip


def _run(kernel, tensors, chip):
    from npusim.functional import run

    return run(kernel, tensors, chip)


def sinkhorn(logits: np.ndarray, iters: int = 20, eps: float = 1e-6, chip: str | Chip = "910b2") -> np.ndarray:
    """Sinkhorn-Knopp of mHC's H_res (models.md §2.5) by the Sinkhorn trace (the vector steps of HcPre): softmax
    over the last axis + eps, divide by column sums + eps, then iters - 1 times rows then columns; logits [T, n, n]
    (fp32) -> a near doubly stochastic matrix."""
    T, n, _ = logits.shape
    mix = np.zeros((T, 2 * n + n * n))
    mix[:, 2 * n:] = rnd(logits.reshape(T, n * n), "fp32")
    out = _run(vector.Sinkhorn(T, n, iters, eps), {"mix": mix}, chip)["mix"]
    return out[:, 2 * n:].reshape(T, n, n)


def mhc_pre(x: np.ndarray, fn: np.ndarray, scale: np.ndarray, base: np.ndarray, iters: int = 20,
            eps: float = 1e-6, chip: str | Chip = "910b2", norm_eps: float = 1e-6):
    """x [T, n, d] residual streams, fn [(2+n)n, n*d], scale [3] (a0, a1, a2), base [(2+n)n] ->
    (y [T, d] = sum_j pre_j X_j, post [T, n], res [T, n, n]) by the HcPre trace (GEMV on the cube in fp32, the
    mixes and Sinkhorn on the vector cores); eps = V4's hc_eps, norm_eps the RMS's."""
    T, n, d = x.shape
    mix = fn.shape[0]
    kern = projection.MhcPre(T, n, d, mix, iters, eps, norm_eps)
    t = {"x": rnd(x.reshape(T, n * d), "bf16"), "w": rnd(fn.T, "fp32"),
         "hc": np.concatenate([np.asarray(scale, float), np.asarray(base, float)])[None],
         "y": np.zeros((T, d)), "post": np.zeros((T, n)), "res": np.zeros((T, n * n))}
    out = _run(kern, t, chip)
    return out["y"], out["post"], out["res"].reshape(T, n, n)


def mhc_post(x: np.ndarray, f: np.ndarray, post: np.ndarray, res: np.ndarray,
             chip: str | Chip = "910b2") -> np.ndarray:
    """x [T, n, d], f [T, d] (the sublayer output), post [T, n], res [T, n, n] -> X' [T, n, d] (bf16 values)."""
    T, n, d = x.shape
    t = {"x": rnd(x.reshape(T * n, d), "bf16"), "f": rnd(f, "bf16"), "post": rnd(post, "fp32"),
         "res": rnd(res.reshape(T, n * n), "fp32"), "out": np.zeros((T * n, d))}
    return _run(vector.MhcPost(T, n, d), t, chip)["out"].reshape(T, n, d)


def rope(x: np.ndarray, positions: np.ndarray, theta: float = 10000.0, interleaved: bool = True,
         chip: str | Chip = "910b2", head_loop: int = 0, rotary: Rotary | None = None,
         cos: np.ndarray | None = None, sin: np.ndarray | None = None) -> np.ndarray:
    """x [T, H, D] rotated by position: pairs (2i, 2i+1) when interleaved (MLA, the V4 attention and Compressor)
    else (i, i + D/2) (the V3.2 indexer after the 2025-11-17 fix); pass the rotated dims only (MLA: the last 64,
    V3.2 indexer: the first 64). Angles: a model's `rotary` table (YaRN, fp32 as the reference), else theta alone,
    or a given cos / sin table [T, D/2]. `head_loop` 1: through aclnnRotaryPositionEmbedding's cut (a copy per head)."""
    T, H, D = x.shape
    if cos is None or sin is None:
        cos, sin = (rotary or Rotary(theta)).table(positions, D)
    t = {"x": rnd(x.reshape(T * H, D), "bf16"), "cos": rnd(cos, "fp32"), "sin": rnd(sin, "fp32"),
         "out": np.zeros((T * H, D))}
    kern = vector.Rope(T, H, D, "interleaved" if interleaved else "half", head_loop=head_loop)
    return _run(kern, t, chip)["out"].reshape(T, H, D)


def quantise(x: np.ndarray, dtype: str = "int8", block: int = -1, chip: str | Chip = "910b2"):
    """x [rows, n] -> (q, scales [rows, n/block]) in int8 / fp8 / mxfp8 / mxfp4 (block -1: the format's default)."""
    kern = vector.Quantise(x.shape[0], x.shape[1], dtype, block)
    t = {"x": rnd(x, "bf16"), "q": np.zeros(x.shape), "s": np.zeros((x.shape[0], kern.blocks()))}
    out = _run(kern, t, chip)
    return out["q"], out["s"]


def dequantise(q: np.ndarray, s: np.ndarray, dtype: str = "int8", block: int = -1,
               chip: str | Chip = "910b2") -> np.ndarray:
    kern = vector.Dequantise(q.shape[0], q.shape[1], dtype, block)
    return _run(kern, {"q": q, "s": s, "x": np.zeros(q.shape)}, chip)["x"]


def swiglu(x: np.ndarray, clamp: float = 0.0, chip: str | Chip = "910b2") -> np.ndarray:
    """x [rows, 2w] = [gate | up] -> silu(gate) * up, with V4's clamp when clamp > 0."""
    rows, w2 = x.shape
    kern = vector.Swiglu(rows, w2 // 2, int(clamp))
    return _run(kern, {"x": rnd(x, "bf16"), "out": np.zeros((rows, w2 // 2))}, chip)["out"]


def copy(x: np.ndarray, repeat: int = 1, dtype: str = "bf16", out_dtype: str = "bf16",
         chip: str | Chip = "910b2") -> np.ndarray:
    """x [rows, cols] stored in `dtype` -> its rows, each `repeat` times in a row, in `out_dtype` (a layout copy, a
    cast, Tensor.repeat)."""
    rows, cols = x.shape
    kern = vector.Copy(rows, cols, repeat, dtype, out_dtype)
    return _run(kern, {"x": rnd(x, dtype), "out": np.zeros((rows * repeat, cols))}, chip)["out"]


def dequant_swiglu_quant(x: np.ndarray, xs: np.ndarray, clamp: float = 0.0, chip: str | Chip = "910b2"):
    """A W8A8 gate-up's int32 x [rows, 2w] = [gate | up] with its rows' scales xs [rows] -> silu(gate xs) (up xs)
    quantised to int8 per row -> (q [rows, w], scales [rows])."""
    rows, w2 = x.shape
    kern = vector.DequantSwigluQuant(rows, w2 // 2, int(clamp))
    t = {"x": np.asarray(x, float), "xs": rnd(np.asarray(xs, float).reshape(-1, 1), "fp32"),
         "q": np.zeros((rows, w2 // 2)), "s": np.zeros((rows, 1))}
    out = _run(kern, t, chip)
    return out["q"], out["s"][:, 0]


def moe_combine(y: np.ndarray, index: np.ndarray, weights: np.ndarray, shared: np.ndarray,
                chip: str | Chip = "910b2") -> np.ndarray:
    """y [rows, d] expert outputs, index [T, k] rows of y per token, weights [T, k], shared [T, d] -> [T, d]."""
    T, k = index.shape
    kern = vector.MoeCombine(T, k, y.shape[1])
    t = {"y": rnd(y, "bf16"), "index": np.asarray(index).reshape(1, T * k), "w": rnd(weights, "fp32"),
         "shared": rnd(shared, "bf16"), "out": np.zeros((T, y.shape[1]))}
    return _run(kern, t, chip)["out"]


def moe_permute(x: np.ndarray, index: np.ndarray, scales: np.ndarray | None = None, out_dtype: str = "",
                chip: str | Chip = "910b2"):
    """Rows x[index] [len(index), d] of x [n, d]: bf16 rows, or int8 rows with their scales [n] (carried along);
    out_dtype 'int8' quantises bf16 rows, one scale per row -> (q, scales)."""
    rows, d = len(index), x.shape[1]
    kern = vector.MoePermute(rows, d, "int8" if scales is not None else "bf16", out_dtype)
    t = {"x": x if scales is not None else rnd(x, "bf16"), "index": np.asarray(index)[None],
         "out": np.zeros((rows, d))}
    if scales is not None:
        t["scales"] = np.asarray(scales, float).reshape(-1, 1)
    if kern.stored == "int8":
        t["out_s"] = np.zeros((rows, 1))
    out = _run(kern, t, chip)
    return (out["out"], out["out_s"][:, 0]) if kern.stored == "int8" else out["out"]


def embedding(ids: np.ndarray, table: np.ndarray, streams: int = 1, chip: str | Chip = "910b2") -> np.ndarray:
    """table rows of ids [T], repeated for `streams` residual streams -> [T, streams, d]."""
    T, d = len(ids), table.shape[1]
    kern = vector.Embedding(T, d, streams)
    t = {"ids": np.asarray(ids)[None], "table": rnd(table, "bf16"), "out": np.zeros((T * streams, d))}
    return _run(kern, t, chip)["out"].reshape(T, streams, d)


def moe_gate(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, topk: int, groups: int = 1, limit: int = 0,
             score: str = "sigmoid", route_scale: float = 1.0, hash_idx: np.ndarray | None = None,
             dtype: str = "bf16", chip: str | Chip = "910b2", **tiles: int):
    """x [T, k] @ w [k, E] -> (weights [T, topk], indices [T, topk]): sigmoid (V3) or sqrt-softplus (V4) scores,
    top-k of scores + bias within the best `limit` of `groups` groups, or the hash table's experts (hash_idx).
    As DeepSeek's Gate: a group ranks by the sum of its two best biased scores when there is a bias, by its best
    score when `bias` is None; dtype fp32 multiplies fp32 x and weights (linear(x.float(), weight.float()))."""
    T, k = x.shape
    E = w.shape[1]
    kern = projection.MoeGate(T, k, E, topk, int(hash_idx is not None), groups, score, limit, route_scale,
                              "top2" if bias is not None else "max", dtype, **tiles)
    t = {"x": rnd(x, dtype), "w": rnd(w, dtype),
         "bias": np.zeros((1, E)) if bias is None else rnd(np.asarray(bias, float), "fp32")[None],
         "weights": np.zeros((T, topk)), "indices": np.zeros((T, topk))}
    if hash_idx is not None:
        t["hash_idx"] = np.asarray(hash_idx)
    out = _run(kern, t, chip)
    return out["weights"], out["indices"].astype(np.int64)


def compressor(x: np.ndarray, w: np.ndarray, ape: np.ndarray, norm: np.ndarray, ratio: int, cos: np.ndarray,
               sin: np.ndarray, quant: str = "", chip: str | Chip = "910b2", **tiles: int) -> np.ndarray:
    """KV Compressor (models.md §2.3) of positions 0 .. T-1: x [T, k], w [k, 2*overlap*d] (= [Wkv | Wgate]),
    ape [ratio, overlap*d], norm [d], cos / sin [T//ratio, rope/2] -> entries [T//ratio, d] (bf16 values);
    overlap 2 when ratio is 4 (CSA), else 1. quant 'fp8': the V4 main KV's fp8 simulation of the non-RoPE dims
    (act_quant(kv[..., :-rope], 64, ue8m0, inplace): quantised and dequantised by the Quantise / Dequantise traces)."""
    T, k = x.shape
    overlap = 2 if ratio == 4 else 1
    kern = projection.Compressor(T, k, w.shape[1], ratio, overlap, 0, 2 * cos.shape[1], **tiles)
    E = kern.count
    t = {"x": rnd(x, "bf16"), "w": rnd(w, "bf16"), "ape": rnd(ape, "fp32"), "norm": rnd(norm, "fp32")[None],
         "cossin": np.concatenate([cos, sin], 1), "out": np.zeros((E, kern.d))}
    return _simulate_quant(_run(kern, t, chip)["out"], 2 * cos.shape[1], quant, chip)


def _simulate_quant(entries: np.ndarray, rope: int, quant: str, chip) -> np.ndarray:
    """The non-RoPE dims quantised and dequantised in 64-element blocks (V4's QAT simulation); '' leaves them."""
    if not quant or not len(entries):
        return entries
    if quant != "fp8":
        raise NpusimError(f"compressor: quant must be '' or 'fp8' (V4's main KV), got '{quant}'", field="quant")
    out = entries.copy()
    q, s = quantise(entries[:, :-rope], "fp8", 64, chip)
    out[:, :-rope] = dequantise(q, s, "fp8", 64, chip)
    return out


@dataclass
class CompressorState:
    """The reference Compressor's carried pooling state (kv_state / score_state): fp32 rows of C and of Z + ape,
    [coff * ratio, coff * d]; with overlap (ratio 4) rows ratio.. hold the current block's tokens and rows ..ratio
    the previous block's (their a-half pooled into the next entry); empty rows have C = 0, Z = -inf."""

    ratio: int
    kv: np.ndarray
    score: np.ndarray

    @classmethod
    def empty(cls, ratio: int, d: int) -> "CompressorState":
        coff = 2 if ratio == 4 else 1
        return cls(ratio, np.zeros((coff * ratio, coff * d)), np.full((coff * ratio, coff * d), -np.inf))

    @property
    def overlap(self) -> bool:
        return self.ratio == 4


def compressor_state(x: np.ndarray, w: np.ndarray, ape: np.ndarray, ratio: int,
                     chip: str | Chip = "910b2") -> CompressorState:
    """The state a prefill of positions 0 .. T-1 leaves (Compressor.forward at start_pos 0): the tokens after the
    last complete block, and with overlap that block's rows; [C | Z] by the traced bf16 GEMM in fp32."""
    from npusim.functional import gemm

    T, half = x.shape[0], w.shape[1] // 2
    st = CompressorState.empty(ratio, half // (2 if ratio == 4 else 1))
    if not T:
        return st
    cz = gemm(rnd(x, "bf16"), w, "bf16", "fp32", chip)
    cut, ape = T - T % ratio, rnd(ape, "fp32")
    if st.overlap and cut >= ratio:
        st.kv[:ratio], st.score[:ratio] = cz[cut - ratio:cut, :half], cz[cut - ratio:cut, half:] + ape
    off = ratio if st.overlap else 0
    st.kv[off:off + T - cut], st.score[off:off + T - cut] = cz[cut:, :half], cz[cut:, half:] + ape[:T - cut]
    return st


def compressor_decode(x: np.ndarray, pos: int, state: CompressorState, w: np.ndarray, ape: np.ndarray,
                      norm: np.ndarray, cos: np.ndarray, sin: np.ndarray, quant: str = "",
                      chip: str | Chip = "910b2") -> tuple[np.ndarray | None, CompressorState]:
    """One decode token x [k] at position `pos` (Compressor.forward at start_pos = pos): its [C | Z] (the traced
    GEMM) joins the state; when it completes a block ((pos + 1) % ratio == 0) the entry pools the state by the
    kernel's pool action (softmax of Z + ape over the rows, weights on C; overlap: the previous block's a-half and
    this block's b-half), then RMSNorm and RoPE at the block's first position (cos / sin [1, rope/2]) by its
    norm_rope action, bf16, and `quant`. Returns (entry [d] or None, the new state)."""
    from npusim.functional import gemm, vector_ops

    r = state.ratio
    cz = gemm(rnd(np.asarray(x)[None], "bf16"), w, "bf16", "fp32", chip)[0]
    half = cz.shape[0] // 2
    kv, score = state.kv.copy(), state.score.copy()
    row = (r if state.overlap else 0) + pos % r
    kv[row], score[row] = cz[:half], cz[half:] + rnd(ape, "fp32")[pos % r]
    new = CompressorState(r, kv, score)
    if (pos + 1) % r:
        return None, new
    d = half // (2 if state.overlap else 1)
    if state.overlap:
        c, z = np.concatenate([kv[:r, :d], kv[r:, d:]]), np.concatenate([score[:r, :d], score[r:, d:]])
        new = CompressorState(r, np.concatenate([kv[r:], kv[r:]]), np.concatenate([score[r:], score[r:]]))
    else:
        c, z = kv, score
    pooled = rnd(vector_ops.pool(c, z, np.zeros((1, z.shape[1])), shape=(1, d), entry=1, c0=0, d=d), "fp32")
    entry = rnd(vector_ops.norm_rope(pooled, rnd(norm, "fp32")[None], np.concatenate([cos, sin], 1),
                                     shape=(1, d), rope=2 * cos.shape[1]), "bf16")
    return _simulate_quant(entry, 2 * cos.shape[1], quant, chip)[0], new


def cache_update(cache: np.ndarray, x: np.ndarray, slots: np.ndarray, chip: str | Chip = "910b2") -> np.ndarray:
    """cache [S, d] (bf16) with rows x [T, d] written at slots [T] (-1 = skip) -> the updated cache."""
    kern = vector.CacheUpdate(x.shape[0], x.shape[1])
    t = {"x": rnd(x, "bf16"), "cache": rnd(cache, "bf16"), "slots": np.asarray(slots)[None]}
    return _run(kern, t, chip)["cache"]
