"""(model, phase, batch, lengths, MTP, quantisation) -> ModelGraph: the ops of every layer type, in order.

V3 / V3.2 (models.md §1): MLA prolog, DSA indexer (V3.2), attention in absorbed (MQA) form — sparse over the top-k
for V3.2, dense for V3.1 decode, naive MHA for V3.1 prefill as production serves it (and for a V3.2 prefill on
request: `dense_prefill`) — then dense FFN or MoE.
V4 (§2): mHC pre/post around each sublayer, shared-KV MQA with the sink and grouped low-rank output, Compressor and
indexer per compress ratio, MoE with sqrt-softplus gate (hash-routed first layers) and clamped SwiGLU.
GQA (Qwen3-MoE, GLM-4.5): one fused q/k/v projection, RMSNorm per q and k head where the model has it (a
`head_rmsnorm`: the NPU backends' fused split-norm-RoPE kernel normalises a block of head rows together, see
npusim.kernels.rowwise), RoPE on the rotary part of the q and k heads, K and V of the KV heads into the cache, causal
flash attention with the query heads of a group sharing their KV head (prefill and decode alike), o_proj; then dense
FFN or MoE. Q/K/V biases are not modelled (a vector add per output).
"""

from __future__ import annotations

from dataclasses import replace

from npusim.errors import NpusimError
from npusim.graph import accounting
from npusim.graph.ops import (LayerGraph, ModelGraph, Op, cache_store, copy, dequant_swiglu_quant, gemm,
                              grouped_gemm, norm, rope, swiglu, vector)
from npusim.graph.positions import Queries
from npusim.spec.model import OVERLAP_RATIO, ModelConfig
from npusim.spec.plan import ModelCode
from npusim.spec.quant import BF16, QuantScheme, Storage, get_quant

PHASES = ("prefill", "decode")
INDEX_BYTES = 4  # int32 top-k indices
# INT8 linears of the MLA + MoE layer whose input arrives in BF16 (a norm's, attention's output) and so is quantised
# per token first; the experts' and the down projections' inputs come quantised (see _Layers.quantised)
DENSE_MLP, SHARED_MLP = ("gate_up_proj", "swiglu", "down_proj"), ("shared_gate_up", "shared_swiglu", "shared_down")
BF16_INPUT_LINEARS = ("q_a_proj", "kv_a_proj", "q_b_proj", "o_proj", "shared_gate_up", "gate_up_proj")


class _Layers:
    """Op factory bound to one model, quantisation and step; one method per sublayer."""

    def __init__(self, model: ModelConfig, quant: QuantScheme, q: Queries, prefill: bool = False,
                 code: ModelCode = ModelCode(), local_routing: bool = False):
        self.m, self.quant, self.q, self.prefill, self.code = model, quant, q, prefill, code
        self.local_routing = local_routing
        self.t = q.tokens
        self.kv_row = accounting.kv_row_bytes(model, quant)
        self.idx_row = accounting.indexer_row_bytes(model, quant) if model.has_indexer else 0.0

    def sequences(self) -> dict[str, int]:
        """A decode attention-type op's sequences: its kernel tiles (sequence, KV head, query block) units, each
        reading its own sequence's keys (the deployments' batched launches: ops-transformer IFA MLA SplitBN /
        SplitBalanced, SFA InitCalcParamsEach, QuantLightningIndexer SplitCore). Prefill keeps one sequence per
        kernel (its causal pairs carry the batch)."""
        return {} if self.prefill else {"sequences": self.q.batch}

    def linear(self, name: str, k: int, n: int, weight_class: str | None, *, batch: int = 1, m: int | None = None,
               kind: str = "gemm") -> Op:
        """A linear of a weight class (None: kept in BF16 under every preset)."""
        w = self.quant.weights(weight_class) if weight_class else BF16
        return gemm(name, self.t if m is None else m, k, n, w, self.quant.activation_for(w), batch=batch, kind=kind)

    def mlp(self, names: tuple[str, str, str], rows: int, k: int, width: int, weight_class: str) -> list[Op]:
        """gate-up, SwiGLU, down of a dense MLP or the shared expert. W8A8 (int8 weights and activations): the gate-up
        leaves int32 accumulators and npu_dequant_swiglu_quant writes the down projection's int8 rows and their
        scales, as the routed experts do (cann-recipes-infer models/deepseek_r1/models/modeling_deepseek.py:164-171,
        DeepseekV3DenseMLP.forward_w8a8int8, and :221-229, DeepseekV3SharedExpert.forward_w8a8int8 @ fbc225d:
        gate_up_proj(x, out_dtype=torch.int32), npu_dequant_swiglu_quant quant_mode 1, down_proj(h, pertoken_scale));
        otherwise a BF16-out linear and SwiGLU."""
        w = self.quant.weights(weight_class)
        act = self.quant.activation_for(w)
        raw = w.dtype == act.dtype == "int8"
        up, mid, down = names
        activate = dequant_swiglu_quant(mid, rows, width, 0.0, act) if raw else swiglu(mid, rows, width, 0.0)
        return [gemm(up, rows, k, 2 * width, w, act, out="int32" if raw else BF16.dtype), activate,
                gemm(down, rows, width, k, w, act)]

    def quantised(self, ops: list[Op]) -> list[Op]:
        """A prefill's per-token dynamic quantisation (DynamicQuant) before each INT8 linear whose input is BF16: the
        W8A8 linear quantises its own input (cann-recipes-infer module/quantization/compressed_tensors/
        compressed_tensors_w8a8_int8.py:89, npu_dynamic_quant then npu_quant_matmul), so q_a_proj and kv_a_proj each
        quantise the same hidden states (separate linears in the R1 prefill, modeling_deepseek.py:1001-1011). The
        routed experts take INT8 rows from init_routing (quant_mode 1) and the down projections from the fused
        dequant-SwiGLU-quant: none there. Decode's few rows are launch-bound and fused where the deployments fuse
        them (MlaProlog, the dispatch's quantisation); their launches are in the fitted overheads.graph_launch."""
        if not self.prefill or self.quant.activation.dtype != "int8":
            return ops
        out: list[Op] = []
        for op in ops:
            if op.kind == "gemm" and op.name in BF16_INPUT_LINEARS and op.dtypes["b"] == "int8":
                rows, k = op.shape["m"], op.shape["k"]
                out.append(cache_store(f"{op.name}_quant", rows, k, self.quant.activation.bytes_for(k),
                                       self.quant.activation))
            out.append(op)
        return out

    # ------------------------------------------------------------------ DeepSeek-V3 / V3.2
    def mla(self, mha: bool, indexer: bool = True) -> list[Op]:
        """MLA with, for V3.2, the DSA indexer: in MHA mode (dense prefill) over up-projected keys, else absorbed.
        Without `indexer` (a GLM-5.x shared layer) the sparse attention reads the top-k an earlier layer chose: no
        indexer op, no indexer key cache."""
        m, t = self.m, self.t
        h, nh, ql, rope_d = m.hidden_size, m.num_attention_heads, m.q_lora_rank, m.qk_rope_head_dim
        nope, v, kvl = m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank
        a = accounting.mla_a_class(m)
        ops = [norm("attn_norm", t, h, residual=True), self.linear("q_a_proj", h, ql, a), norm("q_norm", t, ql),
               self.linear("q_b_proj", ql, nh * (nope + rope_d), "attention"),
               self.linear("kv_a_proj", h, kvl + rope_d, a), norm("kv_norm", t, kvl),
               rope("rope", t, nh + 1, rope_d),
               cache_store("kv_cache_update", t, kvl + rope_d, self.kv_row, self.quant.kv_cache)]
        if m.has_indexer and indexer:
            ops += self.dsa_indexer(select=not mha)
        if mha and self.code.ntd_copies:
            ops.insert(ops.index(next(o for o in ops if o.name == "rope")), self.ntd_copy("q_pe_copy", rope_d))
        if mha:
            ops += self.mha_prefill()
        else:
            ops += [self.linear("q_absorb", nope, kvl, "kv_b", batch=nh), self.mla_attention(),
                    self.linear("o_absorb", kvl, v, "kv_b", batch=nh)]
        return ops + [self.linear("o_proj", nh * v, h, "attention")]

    def dsa_indexer(self, select: bool) -> list[Op]:
        """Indexer prolog (wq_b, wk, LayerNorm, RoPE, Hadamard, quantisation, weights_proj) and the Lightning Indexer.
        Without `select` (an MHA-mode prefill attends to every earlier token) only the key path runs: it fills the
        indexer cache that decode scores."""
        m, t = self.m, self.t
        ih, idim = m.index_n_heads, m.index_head_dim
        heads = ih if select else 0  # query heads roped and rotated beside the one key head
        key_path = [self.linear("idx_k_proj", m.hidden_size, idim, "indexer_k"),
                    norm("idx_k_norm", t, idim, kind="layernorm"),
                    rope("idx_rope", t, heads + 1, m.qk_rope_head_dim), self.hadamard(heads + 1)]
        store = cache_store("indexer_cache_update", t, idim, self.idx_row, self.quant.indexer_cache)
        if not select:
            return key_path + [store]
        return [self.linear("idx_q_b_proj", m.q_lora_rank, ih * idim, "indexer"), *key_path, *self.index_quant(ih),
                self.linear("idx_weights_proj", m.hidden_size, ih, None), store,
                self.lightning_indexer(self.q.pairs(), self.q.last, ratio=1)]

    def hadamard(self, vectors: int) -> Op:
        """Hadamard_128 rotation of q (and k) before quantisation, as a matmul with the constant matrix."""
        d = self.m.index_head_dim
        return gemm("idx_hadamard", self.t * vectors, d, d, BF16, BF16, kind="hadamard")

    def index_quant(self, vectors: int) -> list[Op]:
        """Per-(token, head) quantisation of the indexer query to the indexer cache format (none when BF16)."""
        store = self.quant.indexer_cache
        if not store.quantised:
            return []
        d = self.m.index_head_dim
        return [cache_store("idx_q_quant", self.t * vectors, d, store.bytes_for(d), store)]

    def lightning_indexer(self, pairs: int, keys: int, ratio: int) -> Op:
        """Scores ReLU(q.k) weighted over heads for every visible (compressed) key, then the exact top-k."""
        m, q, store = self.m, self.q, self.quant.indexer_cache
        ih, idim = m.index_n_heads, m.index_head_dim
        topk = min(m.index_topk, keys)
        return Op(name="lightning_indexer", kind="lightning_indexer", unit="cube",
                  shape={"tokens": self.t, "heads": ih, "dim": idim, "keys": keys, "topk": topk, "ratio": ratio,
                         "pairs": pairs} | self.sequences(),
                  dtypes={"q": store.dtype, "k": store.dtype, "out": "int32"}, flops=2.0 * pairs * ih * idim,
                  bytes_read=self.t * (ih * store.bytes_for(idim) + ih * 4) + q.batch * keys * self.idx_row,
                  bytes_written=self.t * topk * INDEX_BYTES)

    def mla_attention(self) -> Op:
        """Absorbed MLA: 576-dim queries per head over shared latent rows; sparse (gathered top-k) when DSA."""
        m, q, t = self.m, self.q, self.t
        nh, kvl, d_qk = m.num_attention_heads, m.kv_lora_rank, m.kv_lora_rank + m.qk_rope_head_dim
        sparse = m.has_indexer
        pairs = q.pairs(m.index_topk if sparse else None)
        rows = pairs if sparse else q.batch * q.last  # gathered per query, or each sequence's cache read once
        return Op(name="attention", kind="sparse_flash_attention" if sparse else "flash_attention", unit="cube",
                  shape={"tokens": t, "heads": nh, "d_qk": d_qk, "d_v": kvl, "keys": q.last,
                         "topk": min(m.index_topk, q.last) if sparse else q.last, "pairs": pairs} | self.sequences(),
                  dtypes={"q": BF16.dtype, "kv": self.quant.kv_cache.dtype, "out": BF16.dtype},
                  flops=2.0 * pairs * nh * (d_qk + kvl),
                  bytes_read=BF16.bytes_for(t * nh * d_qk) + rows * self.kv_row
                  + (t * min(m.index_topk, q.last) * INDEX_BYTES if sparse else 0),
                  bytes_written=BF16.bytes_for(t * nh * kvl))

    def gqa(self) -> list[Op]:
        """GQA attention: every query attends to its sequence's keys, read once per sequence and KV head."""
        m, q, t = self.m, self.q, self.t
        h, nh, kvh, hd = m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim
        ops = [norm("attn_norm", t, h, residual=True),  # npu_add_rms_norm, as ffn_norm
               self.linear("qkv_proj", h, (nh + 2 * kvh) * hd, "attention")]
        if m.qk_norm:
            ops.append(vector("qk_head_norm", "head_rmsnorm", {"tokens": t, "heads": nh + kvh, "width": hd},
                              read=BF16.bytes_for(t * (nh + kvh) * hd), written=BF16.bytes_for(t * (nh + kvh) * hd),
                              flops=4.0 * t * (nh + kvh) * hd, weight_bytes=BF16.bytes_for(2 * hd)))
        pairs = q.pairs()
        attn = Op(name="attention", kind="flash_attention", unit="cube",
                  shape={"tokens": t, "heads": nh, "kv_heads": kvh, "d_qk": hd, "d_v": hd, "keys": q.last,
                         "pairs": pairs} | self.sequences(),
                  dtypes={"q": BF16.dtype, "kv": self.quant.kv_cache.dtype, "out": BF16.dtype},
                  flops=2.0 * pairs * nh * 2 * hd,
                  bytes_read=BF16.bytes_for(t * nh * hd) + q.batch * q.last * self.kv_row,
                  bytes_written=BF16.bytes_for(t * nh * hd))
        return ops + [rope("rope", t, nh + kvh, m.qk_rope_head_dim),
                      cache_store("kv_cache_update", t, 2 * kvh * hd, self.kv_row, self.quant.kv_cache), attn,
                      self.linear("o_proj", nh * hd, h, "attention")]

    def ntd_copy(self, name: str, dim: int) -> Op:
        """A contiguous copy of the `dim` columns of every head of q_b_proj's output (a strided view). The R1 prefill
        (cann-recipes-infer models/deepseek_r1/models/modeling_deepseek.py @ fbc225d) hands interleave_rope q_pe
        transposed to [1, N, T, 64] (:1020-1023) and flash attention q_nope permuted to NTD (:1069), and neither takes
        a non-contiguous tensor (op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_interleave_rope.md and
        torch_npu-npu_fused_infer_attention_score.md: x / query "不支持非连续"); the roped q_pe comes back
        contiguous in NTD (:1025, :1070)."""
        nh = self.m.num_attention_heads
        return copy(name, self.t, nh * dim, BF16.dtype, BF16.dtype)

    def mha_prefill(self) -> list[Op]:
        """Dense prefill in MHA mode: up-project the latents of every key the step sees (a cached prefix's too) with
        kv_b, then causal flash attention. With the model code's NTD copies, k_rope repeated over the heads
        (modeling_deepseek.py:1065, Tensor.repeat: NTD key_rope for NTD_TND attention) and q_nope's copy."""
        m, q, t = self.m, self.q, self.t
        nh, nope, v, rope_d = m.num_attention_heads, m.qk_nope_head_dim, m.v_head_dim, m.qk_rope_head_dim
        d_qk = nope + rope_d
        pairs, keys = q.pairs(), q.batch * q.last
        attn = Op(name="attention", kind="flash_attention", unit="cube",
                  shape={"tokens": t, "heads": nh, "kv_heads": nh, "d_qk": d_qk, "d_v": v, "keys": q.last,
                         "pairs": pairs},
                  dtypes={"q": BF16.dtype, "kv": BF16.dtype, "out": BF16.dtype}, flops=2.0 * pairs * nh * (d_qk + v),
                  bytes_read=BF16.bytes_for(t * nh * d_qk + keys * nh * (d_qk + v)),
                  bytes_written=BF16.bytes_for(t * nh * v))
        copies = [copy("k_rope_repeat", keys, rope_d, BF16.dtype, BF16.dtype, repeat=nh),
                  self.ntd_copy("q_nope_copy", nope)] if self.code.ntd_copies else []
        return [self.linear("kv_b_proj", m.kv_lora_rank, nh * (nope + v), "kv_b", m=keys), *copies, attn]

    # ------------------------------------------------------------------ FFN (both families)
    def ffn_norm(self) -> Op:
        """The FFN's norm; a DeepSeek V3 / V3.2 decoder layer adds the residual in it (npu_add_rms_norm,
        cann-recipes-infer models/deepseek_r1/models/modules.py:83-87 @ fbc225d, as attn_norm does), and so do the
        GQA models' (vLLM's Qwen3MoeDecoderLayer / Glm4MoeDecoderLayer pass the residual to both norms, which
        vllm-ascend's AscendRMSNorm.forward_oot and SGLang's RMSNorm on NPU run as torch_npu.npu_add_rms_norm);
        V4's mHC keeps the plain norm."""
        return norm("ffn_norm", self.t, self.m.hidden_size, residual=not self.m.is_v4)

    def ffn(self, layer: int) -> list[Op]:
        m, t, h = self.m, self.t, self.m.hidden_size
        if m.is_dense_ffn(layer):
            inter = m.intermediate_size
            return [self.ffn_norm(), *self.mlp(DENSE_MLP, t, h, inter, "dense_ffn")]
        e, k, inter = m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size
        rows = t * k
        touched = e * (1.0 - (1.0 - k / e) ** t)  # expected distinct experts under uniform routing
        w = self.quant.routed_experts
        hashed = layer < m.num_hash_layers
        gate = self.router(h, e)
        gate = replace(gate, shape=gate.shape | {"topk": k, "hash": int(hashed), "groups": m.n_group})
        act = self.quant.activation_for(w)
        # W8A8 experts: the gate-up leaves int32 accumulators that one vector kernel dequantises, activates and
        # quantises per row for the down projection (cann-recipes-infer module/quantization/compressed_tensors/
        # compressed_tensors_moe_gmm.py:159-186, npu_grouped_matmul output_dtype int32 then npu_dequant_swiglu_quant)
        raw = w.dtype == act.dtype == "int8"
        activate = dequant_swiglu_quant("experts_swiglu", rows, inter, m.swiglu_limit, act) if raw else \
            swiglu("experts_swiglu", rows, inter, m.swiglu_limit)
        cast = [copy("moe_gate_cast", t, h, BF16.dtype, "fp32")] if self.code.router_dtype == "fp32" else []
        ops = [self.ffn_norm(), *cast, gate, *self.routing("moe_init_routing", "moe_re_routing", rows, act),
               grouped_gemm("experts_gate_up", rows, h, 2 * inter, touched, w, act, out="int32" if raw else "bf16"),
               activate,
               grouped_gemm("experts_down", rows, inter, h, touched, w, act), *self.routing("moe_unsort", "", rows)]
        if m.n_shared_experts:
            width = m.n_shared_experts * inter
            ops += self.mlp(SHARED_MLP, t, h, width, "shared_experts")
        combine = vector("moe_combine", "moe_combine", {"tokens": t, "topk": k, "hidden": h},
                         read=BF16.bytes_for(rows * h + t * h), written=BF16.bytes_for(t * h), flops=2.0 * rows * h)
        return ops + [combine]

    def router(self, h: int, experts: int) -> Op:
        """The MoE gate's GEMM (kept out of every quantisation preset); the model code's fp32 router runs it on fp32
        hidden states (the cast is moe_gate_cast) and an fp32 weight: cann-recipes-infer models/deepseek_r1/models/
        modeling_deepseek.py:313-318 (ReplicatedLinear params_dtype=torch.float32) and :334-335
        (hidden_states.to(torch.float32), self.gate) @ fbc225d."""
        if self.code.router_dtype == "fp32":
            f32 = Storage(dtype="fp32")
            return gemm("moe_gate", self.t, h, experts, f32, f32, kind="moe_gate")
        return self.linear("moe_gate", h, experts, None, kind="moe_gate")

    def routing(self, first: str, second: str, rows: int, act: Storage = BF16) -> list[Op]:
        """A bulk prefill's routing passes over the top-k rows (cann-recipes R1 "double routing"): before the
        experts, init_routing (expand + sort by expert, INT8 per row when the experts take INT8: quant_mode 1) and
        re_routing (the received rows by local expert); after them the un-sort of their BF16 outputs
        (index_select). Decode's fused dispatch / combine route inside the communication kernel: none there. The
        finalize_routing that restores the tokens' order and weights the rows is moe_combine. With `local_routing`
        (MoE TP without EP: no dispatch kernel routes the rows) decode runs the init_routing too (vllm-ascend's
        all-gather path: npu_moe_init_routing_v2 before the grouped matmuls)."""
        if not self.prefill and not (self.local_routing and first == "moe_init_routing"):
            return []
        if not self.prefill:
            second = ""  # the rows never left the rank: nothing to re-route or un-sort
        h, out = self.m.hidden_size, act if act.dtype == "int8" else BF16

        def permute(name: str, src: Storage) -> Op:
            return replace(vector(name, "moe_permute", {"rows": rows, "hidden": h}, read=src.bytes_for(rows * h),
                                  written=out.bytes_for(rows * h), flops=3.0 * rows * h if src is not out else 0.0),
                           dtypes={"x": src.dtype, "out": out.dtype})

        return [permute(first, BF16)] + ([permute(second, out)] if second else [])

    # ------------------------------------------------------------------ DeepSeek-V4
    def mhc_pre(self, name: str, sinkhorn: bool = True) -> Op:
        """H_pre / H_post / H_res from a (2+n)n-wide GEMV of the n-stream residual, Sinkhorn, then the pre-sum."""
        m, t, h, n = self.m, self.t, self.m.hidden_size, self.m.hc_mult
        mix = (2 + n) * n if sinkhorn else n
        iters = m.hc_sinkhorn_iters if sinkhorn else 0
        return Op(name=name, kind="mhc_pre", unit="cube",
                  shape={"tokens": t, "streams": n, "hidden": h, "mix": mix, "sinkhorn_iters": iters},
                  dtypes={"x": BF16.dtype, "fn": "fp32"},
                  flops=2.0 * t * n * h * mix + 2.0 * t * n * h + 4.0 * t * iters * n * n,
                  bytes_read=BF16.bytes_for(t * n * h) + 4.0 * mix * n * h,
                  bytes_written=BF16.bytes_for(t * h) + 4.0 * t * mix, weight_bytes=4.0 * mix * n * h)

    def mhc_post(self, name: str) -> Op:
        """X' = H_post^T F(y) + H_res^T X over the n streams."""
        t, h, n = self.t, self.m.hidden_size, self.m.hc_mult
        return vector(name, "mhc_post", {"tokens": t, "streams": n, "hidden": h},
                      read=BF16.bytes_for(t * n * h + t * h), written=BF16.bytes_for(t * n * h),
                      flops=2.0 * t * (n * n * h + n * h))

    def compressor(self, name: str, ratio: int, dim: int, weight_class: str, row_bytes: float) -> Op:
        """Gated pooling of `ratio` tokens (2x overlapping for ratio 4) into one cache entry, with its epilog."""
        coff = 2 if ratio == OVERLAP_RATIO else 1
        proj = self.linear(name, self.m.hidden_size, 2 * coff * dim, weight_class, kind="compressor")
        entries = self.q.new_entries(ratio)
        pool = 4.0 * self.t * coff * dim  # softmax(Z + ape) * C accumulated per channel
        return replace(proj, shape=proj.shape | {"ratio": ratio, "overlap": coff, "entries": entries},
                       flops=proj.flops + pool, bytes_written=proj.bytes_written + entries * row_bytes)

    def v4_attention(self, layer: int) -> list[Op]:
        m, q, t = self.m, self.q, self.t
        h, nh, hd, ql, rope_d = m.hidden_size, m.num_attention_heads, m.head_dim, m.q_lora_rank, m.qk_rope_head_dim
        r, w = m.compress_ratio(layer), m.sliding_window
        ops = [self.mhc_pre("mhc_pre_attn"), norm("attn_norm", t, h), self.linear("q_a_proj", h, ql, "attention"),
               norm("q_norm", t, ql), self.linear("q_b_proj", ql, nh * hd, "attention"),
               vector("q_head_norm", "rmsnorm", {"tokens": t, "heads": nh, "width": hd},
                      read=BF16.bytes_for(t * nh * hd), written=BF16.bytes_for(t * nh * hd), flops=3.0 * t * nh * hd),
               self.linear("kv_proj", h, hd, "attention"), norm("kv_norm", t, hd), rope("rope", t, nh + 1, rope_d),
               cache_store("kv_cache_update", t, hd, self.kv_row, self.quant.kv_cache)]
        window_pairs = q.pairs(w)
        rows = q.batch * min(q.last, w)  # the window ring is read once per sequence
        selected = 0
        if r:
            ops.append(self.compressor("kv_compressor", r, hd, "attention", self.kv_row))
        if r == OVERLAP_RATIO:
            ih, idim = m.index_n_heads, m.index_head_dim
            keys = q.last // r
            ops += [self.linear("idx_q_b_proj", ql, ih * idim, "indexer"),
                    self.linear("idx_weights_proj", h, ih, None),
                    self.compressor("idx_compressor", r, idim, "indexer", self.idx_row),
                    rope("idx_rope", t, ih, rope_d), self.hadamard(ih), *self.index_quant(ih),
                    self.lightning_indexer(q.compressed_pairs(r), keys, ratio=r)]
            selected = q.compressed_pairs(r, m.index_topk)
            rows += selected  # gathered per query
        elif r:
            selected = q.compressed_pairs(r)
            rows += q.batch * (q.last // r)  # HCA: every compressed entry, read once per sequence
        pairs = window_pairs + selected
        attn = Op(name="attention", kind="v4_attention", unit="cube",
                  shape={"tokens": t, "heads": nh, "head_dim": hd, "window": w, "ratio": r,
                         "topk": m.index_topk if r == OVERLAP_RATIO else 0, "pairs": pairs, "sink": 1}
                  | self.sequences(),
                  dtypes={"q": BF16.dtype, "kv": self.quant.kv_cache.dtype, "out": BF16.dtype},
                  flops=2.0 * pairs * nh * 2 * hd,
                  bytes_read=BF16.bytes_for(t * nh * hd) + rows * self.kv_row + 4.0 * nh,
                  bytes_written=BF16.bytes_for(t * nh * hd))
        group = nh // m.o_groups * hd
        return ops + [attn, self.linear("o_a_proj", group, m.o_lora_rank, "attention", batch=m.o_groups),
                      self.linear("o_b_proj", m.o_groups * m.o_lora_rank, h, "attention"),
                      self.mhc_post("mhc_post_attn")]

    def decoder(self, layer: int, mha: bool) -> list[Op]:
        """One decoder layer; `mha` selects MLA's MHA-mode (dense prefill) attention (V4 has one form)."""
        if self.m.is_v4:
            return (self.v4_attention(layer) + [self.mhc_pre("mhc_pre_ffn")] + self.ffn(layer)
                    + [self.mhc_post("mhc_post_ffn")])
        if self.m.is_gqa:
            return self.gqa() + self.ffn(layer)
        return self.quantised(self.mla(mha, self.m.runs_indexer(layer)) + self.ffn(layer))

    # ------------------------------------------------------------------ ends of the model
    def embedding(self) -> Op:
        h, n, store = self.m.hidden_size, self.m.hc_mult, self.quant.embedding
        rows = store.bytes_for(self.t * h)
        return Op(name="embedding", kind="embedding", unit="memory", shape={"tokens": self.t, "hidden": h,
                                                                             "streams": n},
                  dtypes={"table": store.dtype}, flops=0.0, bytes_read=rows + 4.0 * self.t,
                  bytes_written=BF16.bytes_for(self.t * h * n), weight_bytes=rows)

    def head(self, tokens: int) -> list[Op]:
        """Final (hc_head,) norm and vocabulary projection on the `tokens` positions that need logits."""
        m = self.m
        ops = [self.mhc_pre("mhc_head", sinkhorn=False)] if m.hc_mult > 1 else []
        return ops + [norm("final_norm", tokens, m.hidden_size),
                      self.linear("lm_head", m.hidden_size, m.vocab_size, "lm_head", m=tokens)]

    def mtp(self, layer: int, mha: bool, head_tokens: int) -> list[Op]:
        """MTP block: embed the next token, mix with the hidden state, one decoder layer, shared head."""
        m, t, h = self.m, self.t, self.m.hidden_size
        if m.is_v4:
            mix = [self.linear("e_proj", h, h, "attention"), self.linear("h_proj", h, h, "attention")]
        else:
            mix = [self.linear("eh_proj", 2 * h, h, "attention")]
        return ([self.embedding(), norm("enorm", t, h), norm("hnorm", t, h), *mix]
                + self.decoder(layer, mha) + self.head(head_tokens))


def _check(model: ModelConfig, phase: str, batch: int, length: int, mtp_tokens: int) -> None:
    if phase not in PHASES:
        raise NpusimError(f"unknown phase '{phase}' (allowed: {', '.join(PHASES)})", field="--phase")
    what = "--seq-len" if phase == "prefill" else "--context"
    for name, value, low in (("--batch", batch, 1), (what, length, 1), ("--mtp", mtp_tokens, 0)):
        if value < low:
            raise NpusimError(f"must be >= {low}, got {value}", field=name)
    if mtp_tokens and not model.num_nextn_predict_layers:
        raise NpusimError(f"{model.name} has no MTP layer (num_nextn_predict_layers is 0)", field="--mtp")
    total = length + (mtp_tokens if phase == "decode" else 0)
    if total > model.max_position_embeddings:
        raise NpusimError(f"{total} tokens exceed {model.name}'s max_position_embeddings "
                          f"({model.max_position_embeddings})", field=what)


def build_graph(model: ModelConfig, phase: str, batch: int, length: int, *, mtp_tokens: int = 0,
                quant: str | QuantScheme | None = None, cached: int = 0, dense_prefill: bool = False,
                code: ModelCode = ModelCode(), local_routing: bool = False,
                draft: ModelConfig | None = None) -> ModelGraph:
    """The op graph of one prefill (`length` = prompt tokens per sequence computed now, on top of `cached` already in
    each sequence's cache: a prefix-cache hit or earlier chunks) or one decode step (`length` = context: keys the
    first new token sees, itself included; with MTP, 1 + mtp_tokens queries per sequence). `dense_prefill` builds a
    V3.2 prefill in MHA mode as V3.1's (kv_b up-projection, causal flash attention), the indexer only writing its key
    cache, instead of Lightning Indexer + sparse attention (models.md §1.4). `code`: the ops the deployment's model
    code adds (the plan's model_code). `local_routing`: a decode step's MoE routes its rows itself (init_routing),
    as MoE TP without EP does (no dispatch kernel routes them). `draft`: an EAGLE-3 draft model proposes the
    `mtp_tokens` drafts instead of the model's own MTP layer (`draft_layers`)."""
    _check(model, phase, batch, length + cached, mtp_tokens if draft is None else 0)
    if cached < 0 or (cached and phase != "prefill"):
        raise NpusimError(f"cached tokens are a prefill quantity >= 0, got {cached} for {phase}", field="cached")
    scheme = quant if isinstance(quant, QuantScheme) else get_quant(quant or model.default_quant)
    prefill = phase == "prefill"
    mha = prefill and (dense_prefill or not model.has_indexer)
    q = Queries(batch=batch, first=cached + 1, per_seq=length) if prefill else \
        Queries(batch=batch, first=length, per_seq=1 + mtp_tokens)
    f = _Layers(model, scheme, q, prefill, code, local_routing)
    head_tokens = batch if prefill else q.tokens  # prefill needs logits of the last position only
    groups: dict[str, list[int]] = {}
    for layer in range(model.num_hidden_layers):
        groups.setdefault(_layer_key(model, layer), []).append(layer)
    layers = [LayerGraph(name="embedding", ops=(f.embedding(),))]
    for key, members in groups.items():
        layers.append(LayerGraph(name=key, ops=tuple(f.decoder(members[0], mha)), layers=tuple(members),
                                 repeat=len(members)))
    layers.append(LayerGraph(name="lm_head", ops=tuple(f.head(head_tokens))))
    if mtp_tokens and draft is not None:
        layers += draft_layers(draft, model.hidden_size, phase, batch, length, cached, mtp_tokens)
    elif mtp_tokens:
        mtp_layer = model.num_hidden_layers
        if prefill:
            ops = f.mtp(mtp_layer, mha, head_tokens)  # fills the MTP layer's cache over the whole prompt
            repeat = 1
        else:
            ops = _Layers(model, scheme, Queries(batch=batch, first=length, per_seq=1), code=code,
                          local_routing=local_routing).mtp(mtp_layer, False,
                                                                                                        batch)
            repeat = mtp_tokens  # one draft token per pass
        layers.append(LayerGraph(name="mtp", ops=tuple(ops), layers=(mtp_layer,), repeat=repeat))
    scenario = {"batch": batch, ("seq_len" if prefill else "context"): length, "mtp_tokens": mtp_tokens,
                "layers": model.num_hidden_layers,
                "tokens": q.tokens}
    return ModelGraph(model=model.name, phase=phase, quant=scheme.name, scenario=scenario, layers=tuple(layers))


def draft_layers(draft: ModelConfig, target_hidden: int, phase: str, batch: int, length: int, cached: int,
                 drafts: int) -> list[LayerGraph]:
    """An EAGLE-3 draft's passes in BF16 (`spec.draft`), as SGLang's EAGLE worker runs them with top-k 1.

    Prefill: one extend over the prompt fills the draft's cache (logits of the last position). Decode: after the
    target verifies 1 + drafts tokens per sequence, the draft extends over them (the fc folds three target hidden
    states into one, and its pass gives the first draft token), then drafts - 1 single-token passes give the rest
    (--speculative-num-steps = drafts, --speculative-num-draft-tokens = drafts + 1). Each pass is the draft's decoder
    layer, whose q/k/v read the embedding beside the hidden state (the embedding half is its own GEMM here), and its
    lm_head over the draft vocabulary."""
    scheme = get_quant("bf16")
    h, kv = draft.hidden_size, (draft.num_attention_heads + 2 * draft.num_key_value_heads) * draft.head_dim

    def one_pass(q: Queries, head_tokens: int, fold: bool) -> tuple[Op, ...]:
        f = _Layers(draft, scheme, q, phase == "prefill")
        fc = [f.linear("draft_fc", 3 * target_hidden, h, None)] if fold else []
        return tuple([f.embedding(), *fc, norm("draft_enorm", f.t, h),
                      f.linear("draft_qkv_embed", h, kv, None)] + f.decoder(0, phase == "prefill")
                     + f.head(head_tokens))

    if phase == "prefill":
        q = Queries(batch=batch, first=cached + 1, per_seq=length)
        return [LayerGraph(name="draft_extend", ops=one_pass(q, batch, True), layers=(0,))]
    extend = Queries(batch=batch, first=length, per_seq=1 + drafts)
    out = [LayerGraph(name="draft_extend", ops=one_pass(extend, extend.tokens, True), layers=(0,))]
    if drafts > 1:
        step = Queries(batch=batch, first=length + 1, per_seq=1)
        out.append(LayerGraph(name="draft", ops=one_pass(step, batch, False), layers=(0,), repeat=drafts - 1))
    return out


def _layer_key(model: ModelConfig, layer: int) -> str:
    """Name of the layer type; identical names build identical ops."""
    if model.is_v4:
        return f"{model.attention_kind(layer)}{'-hash' if layer < model.num_hash_layers else ''}-moe"
    return f"{model.attention_kind(layer)}-{'dense' if model.is_dense_ffn(layer) else 'moe'}"
