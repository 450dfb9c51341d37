"""RoPE frequencies and the MLA softmax scale as DeepSeek's reference builds them (V3.2-Exp / V4 inference/model.py
`precompute_freqs_cis`, `MLA.__init__`), from a model's config.

YaRN: base frequencies f_i = 1 / theta^(2i/d); when the model runs past its original context (max_seq_len >
original_seq_len) the dims between the correction range [low, high] (from beta_fast / beta_slow rotations over the
original length) blend f_i / factor and f_i by a linear ramp: f_i' = f_i / factor (1 - smooth_i) + f_i smooth_i,
smooth_i = 1 - clamp((i - low) / (high - low), 0, 1). The table is computed in fp32 as the reference does (torch
float32: the angle at position p is fp32(p * f_i'), so at p ~ 1e5 it carries the reference's ~1e-2 rad rounding too).
The absorbed MLA's softmax scale is (qk_nope + qk_rope)^-0.5 * mscale^2, mscale = 0.1 mscale_factor ln(factor) + 1
under YaRN (V4's shared-KV attention: head_dim^-0.5, no mscale). Limits: V4's per-layer choice (rope_theta on
window-only layers, compress_rope_theta with YaRN on CSA / HCA layers) is the caller's: build one Rotary per theta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from npusim.errors import NpusimError


# The RoPE / MLA keys of DeepSeek-V3.2-Exp's config.json (models.md §1.1: theta 10000, YaRN factor 40 over 4096,
# beta 32 / 1, mscale 1.0, max_position_embeddings 163840)
DEEPSEEK_V32 = {"rope_theta": 10000, "max_position_embeddings": 163840, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 40,
                                                         "original_max_position_embeddings": 4096, "beta_fast": 32,
                                                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}


@dataclass(frozen=True)
class Rotary:
    """One RoPE table's parameters (the reference's ModelArgs names)."""

    theta: float = 10000.0
    factor: float = 1.0  # rope_factor
    original_seq_len: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    max_seq_len: int = 0  # the context the model runs at; YaRN applies when it exceeds original_seq_len

    @classmethod
    def from_config(cls, cfg: dict, theta_key: str = "rope_theta") -> "Rotary":
        """From a Hugging Face config.json (rope_theta, rope_scaling {factor, original_max_position_embeddings,
        beta_fast, beta_slow, mscale_all_dim / mscale}, max_position_embeddings) or the reference's inference config
        (rope_factor, original_seq_len, beta_fast, beta_slow, mscale, max_seq_len). `theta_key`: V4's
        compress_rope_theta for its compressed layers."""
        if theta_key not in cfg:
            raise NpusimError(f"model config has no '{theta_key}' (the RoPE base)", field=theta_key)
        sc = cfg.get("rope_scaling") or {}
        if sc and sc.get("type", sc.get("rope_type", "yarn")) != "yarn":
            raise NpusimError(f"rope_scaling type '{sc.get('type')}' is not supported; allowed: yarn",
                              field="rope_scaling")
        get = lambda hf, ref, default: sc.get(hf, cfg.get(ref, default))  # noqa: E731
        return cls(float(cfg[theta_key]), float(get("factor", "rope_factor", 1.0)),
                   int(get("original_max_position_embeddings", "original_seq_len", 0)),
                   float(get("beta_fast", "beta_fast", 32.0)), float(get("beta_slow", "beta_slow", 1.0)),
                   float(sc.get("mscale_all_dim", sc.get("mscale", cfg.get("mscale", 1.0)))),
                   int(cfg.get("max_position_embeddings", cfg.get("max_seq_len", 0))))

    @property
    def yarn(self) -> bool:
        return self.original_seq_len > 0 and self.max_seq_len > self.original_seq_len

    def freqs(self, dim: int) -> np.ndarray:
        """The dim/2 frequencies in fp32, as precompute_freqs_cis computes them."""
        f32 = np.float32
        f = f32(1.0) / np.power(f32(self.theta), np.arange(0, dim, 2, dtype=f32) / f32(dim))
        if self.yarn:
            def corr(rot: float) -> float:
                return dim * math.log(self.original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(self.theta))
            low, high = max(math.floor(corr(self.beta_fast)), 0), min(math.ceil(corr(self.beta_slow)), dim - 1)
            high = high + 0.001 if low == high else high
            ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
            smooth = f32(1) - ramp
            f = f / f32(self.factor) * (f32(1) - smooth) + f * smooth
        return f.astype(f32)

    def table(self, positions: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) [len(positions), dim/2]: fp32 angles fp32(p * f_i), their cosine and sine in fp32."""
        ang = np.outer(np.asarray(positions).astype(np.float32), self.freqs(dim)).astype(np.float32)
        return np.cos(ang).astype(np.float64), np.sin(ang).astype(np.float64)

    def attention_mscale(self) -> float:
        return 0.1 * self.mscale * math.log(self.factor) + 1.0 if self.yarn else 1.0


def mla_softmax_scale(cfg: dict) -> float:
    """The absorbed MLA's softmax scale of a model config: (qk_nope_head_dim + qk_rope_head_dim)^-0.5 * mscale^2
    (DeepSeek MLA.__init__), not the 576-dim query's 576^-0.5."""
    for key in ("qk_nope_head_dim", "qk_rope_head_dim"):
        if key not in cfg:
            raise NpusimError(f"model config has no '{key}' (the MLA softmax scale needs it)", field=key)
    return (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5 * Rotary.from_config(cfg).attention_mscale() ** 2
