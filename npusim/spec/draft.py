"""EAGLE-3 draft models: a draft checkpoint's config.json as the one-layer GQA model npusim times beside its target.

An EAGLE-3 draft (`LlamaForCausalLMEagle3`, SGLang / vLLM `--speculative-algorithm EAGLE3`) is one Llama decoder
layer whose attention reads the token embedding concatenated with the hidden state (2 x hidden wide), an fc that
folds three of the target's hidden states into one at the first draft step, and its own lm_head over
`draft_vocab_size`. The deployments run it unquantised (BF16). It becomes a ModelConfig of the GQA family with every
layer dense, so the graph builder's own GQA decoder and dense MLP time it; `graph.builder` adds the embedding half of
the q/k/v projections and the fc.
"""

from __future__ import annotations

import functools
from pathlib import Path

from npusim.errors import NpusimError
from npusim.spec.catalog import data_root, display_path
from npusim.spec.model import ModelConfig
from npusim.spec.schema import read_json

ARCHITECTURES = ("LlamaForCausalLMEagle3",)
REQUIRED = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def draft_path(name: str) -> Path:
    """A draft's config.json: as given (absolute or from the working directory), else from the project's data."""
    path = Path(name)
    return path if path.is_file() or path.is_absolute() else data_root() / name


@functools.lru_cache(maxsize=32)
def load_draft(name: str, field: str = "mtp.draft", file: str | None = None) -> ModelConfig:
    """The draft named by a plan's `mtp.draft`: refused in one sentence unless it is an EAGLE-3 config.json."""
    path = draft_path(name)
    if not path.is_file():
        raise NpusimError(f"'{name}' is not a draft model config.json", file=file, field=field)
    shown = display_path(path)
    raw = read_json(path, shown)
    arch = (raw.get("architectures") or [None])[0] if isinstance(raw, dict) else None
    if arch not in ARCHITECTURES:
        raise NpusimError(f"is a {arch or 'config without architectures'}; npusim times EAGLE-3 drafts "
                          f"({', '.join(ARCHITECTURES)})", file=shown, field="architectures")
    for key in REQUIRED:
        if not isinstance(raw.get(key), int) or raw[key] < 1:
            raise NpusimError("must be a positive whole number", file=shown, field=key)
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    layers = raw.get("num_hidden_layers", 1)
    return ModelConfig(name=path.parent.name if path.stem == "config" else path.stem, model_type="gqa_moe",
                       description="EAGLE-3 draft", vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
                       hidden_size=raw["hidden_size"], num_hidden_layers=layers, max_position_embeddings=2**31 - 1,
                       num_attention_heads=heads, num_key_value_heads=raw.get("num_key_value_heads") or heads,
                       head_dim=head_dim, qk_rope_head_dim=head_dim, intermediate_size=raw["intermediate_size"],
                       first_k_dense_replace=layers, moe_intermediate_size=1, n_routed_experts=1,
                       num_experts_per_tok=1, scoring_func="softmax", routed_scaling_factor=1.0)
