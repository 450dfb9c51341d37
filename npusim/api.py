"""The public Python API: what the CLI runs, for notebooks and scripts.

    import npusim
    p = npusim.predict("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-pd-a17", input=131072, output=1024, batch=256)
    p.ttft, p.tpot, p.breakdown("decode")
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from npusim.errors import NpusimError, did_you_mean
from npusim.kernels.catalog import names as kernel_names
from npusim.parallel.af import af_step
from npusim.parallel.memory import memory, require_fit
from npusim.parallel.shard import shard
from npusim.parallel.step import StepTime, step_time
from npusim.parallel.transfer import exposed, kv_path
from npusim.results.energy import step_energy
from npusim.results.prediction import Prediction
from npusim.spec.draft import load_draft
from npusim.spec.model import ModelConfig, load_model
from npusim.spec.plan import Plan, load_plan
from npusim.spec.quant import QuantScheme, get_quant
from npusim.spec.schema import setting
from npusim.spec.system import System, load_system

# The bundled default: DeepSeek-V3.2-Exp BF16 at 128K on CloudMatrix384 with the A17 plans (published.md A17).
DEFAULT = {"hw": "cloudmatrix384", "model": "deepseek-v3.2-exp", "plan": "v32-a3-pd-a17", "input": 131072,
           "output": 1024, "batch": 256, "quant": "bf16"}


def split_overrides(overrides: dict[str, str] | None) -> dict[str, dict[str, str]]:
    """Route `--set` keys by prefix: plan.*, model.*, and everything else to the hardware (system, then chip)."""
    out = {"hw": {}, "plan": {}, "model": {}}
    for key, value in (overrides or {}).items():
        value = setting(value, "--set", key)  # errors name the key as written, prefix included
        head, _, rest = key.partition(".")
        if head in ("plan", "model") and rest:
            out[head][rest] = value
        else:
            out["hw"][key] = value
    return out


@dataclass(frozen=True)
class Setup:
    """A loaded and checked (system, model, plan, quantisation), `--set` overrides applied: what gets timed."""

    system: System
    model: ModelConfig
    plan: Plan
    quant: QuantScheme


def load_setup(hw: str = DEFAULT["hw"], model: str = DEFAULT["model"], plan: str = DEFAULT["plan"],
               quant: str | None = DEFAULT["quant"], overrides: dict[str, str] | None = None) -> Setup:
    """Load the named system, model, plan and quantisation (None: the model's own) and refuse a plan that does not
    divide the model or fit the system."""
    routed = split_overrides(overrides)
    system = _by_name("--hw", load_system, hw, routed["hw"])
    cfg = _by_name("--model", load_model, model, routed["model"])
    pl = _by_name("--plan", load_plan, plan, routed["plan"])
    _check_plan(cfg, pl, system)
    return Setup(system, cfg, pl, get_quant(quant or cfg.default_quant))


def _by_name(option: str, load, name, overrides):
    """A spec loaded by the name given as `option`; a name that is not a text or finds nothing is refused as that
    option (which a scenario, baseline or sweep file then names as its own field)."""
    if not isinstance(name, str):
        raise NpusimError(f"must be a name, got {name!r}", field=option)
    try:
        return load(name, overrides)
    except NpusimError as exc:
        if exc.file is None and exc.field is None:
            raise NpusimError(exc.detail, field=option) from None
        raise


def predict(hw: str = DEFAULT["hw"], model: str = DEFAULT["model"], plan: str = DEFAULT["plan"], *,
            input: int = DEFAULT["input"], output: int = DEFAULT["output"], batch: int = DEFAULT["batch"],
            prefill_batch: int = 1, context: int | None = None, quant: str | None = DEFAULT["quant"],
            prefix_hit: float = 0.0, overrides: dict[str, str] | None = None) -> Prediction:
    """TTFT of `prefill_batch` prompts of `input` tokens, and TPOT of a decode step of the global `batch` at
    `context` (default: input + output / 2, the mean context while generating). A decode-only plan (no prefill
    instance, not colocated) has no TTFT: the prediction's prefill figures are None and its notes say why.

    `prefix_hit` (a fraction in [0, 1)): that share of each prompt is already cached (a shared prefix, the radix
    cache): the prefill computes only the rest, attending to the cached blocks, and only the rest crosses to the
    decode pool (its radix cache holds the prefix); the cache memory still counts the whole prompt.

    Arguments (valid values and units; bad ones raise NpusimError naming the argument):
      hw: a system (`npusim hw list`: atlas-800-a2, atlas-800-a3, cloudmatrix384, atlas-950-superpod) or a system
          YAML path; default cloudmatrix384.
      model: a model (`npusim model list`: deepseek-v3.2-exp, deepseek-v3.1, deepseek-v4-flash, deepseek-v4-pro), a
          model YAML path or a Hugging Face config.json (workloads/models/hf/*/config.json ship); default
          deepseek-v3.2-exp.
      plan: a shipped plan (`npusim list plans`) or a plan YAML path; default v32-a3-pd-a17.
      input: prompt tokens per request, a whole number >= 1, at most the model's max_position_embeddings; default
          131072.
      output: output tokens per request, a whole number >= 1; default 1024.
      batch: the global decode batch (sequences decoding at once over all decode instances), a whole number >= 1;
          default 256.
      prefill_batch: prompts prefilled together in one step, a whole number >= 1; default 1.
      context: tokens the decode step attends to per sequence, a whole number >= 1 (default input + output // 2).
      quant: a quantisation preset (bf16, w8a8, w8a8-modelslim, w8a8c8, w8a8-ic8, w4a16, w4a8, w4a8c8, fp8,
          mxfp8-mxfp4; `npusim model show --help`) or None for the checkpoint's own format; default bf16.
      prefix_hit: share of each prompt already in the prefix cache, a fraction in [0, 1); default 0.
      overrides: dotted field -> value with units, as `--set` takes them (e.g. {"hbm.bandwidth": "2TB/s",
          "plan.decode.moe.ep": "64"}); default none.
    Returns a Prediction: times in seconds (ttft, tpot), memory in bytes, energy in joules, throughput in tokens
    per second per chip."""
    for name, value in (("--input", input), ("--output", output), ("--batch", batch),
                        ("--prefill-batch", prefill_batch)):
        if value < 1:
            raise NpusimError(f"must be a positive whole number, got {value}", field=name)
    if not 0.0 <= prefix_hit < 1.0:
        raise NpusimError(f"must be a fraction in [0, 1), got {prefix_hit}", field="--prefix-hit")
    hit = math.floor(prefix_hit * input)
    setup = load_setup(hw, model, plan, quant, overrides)
    system, cfg, pl, scheme = setup.system, setup.model, setup.plan, setup.quant
    ctx = context if context is not None else input + output // 2
    if ctx < 1:
        raise NpusimError(f"must be a positive whole number, got {ctx}", field="--context")
    for name, tokens in (("--input", input), ("--context", ctx)):
        if tokens > cfg.max_position_embeddings:
            raise NpusimError(f"{tokens} tokens exceed {cfg.name}'s max_position_embeddings "
                              f"({cfg.max_position_embeddings})", field=name)
    steps, mems, chunk_times = {}, {}, {}
    af = None
    phases = (("prefill", prefill_batch, input),) if pl.runs_prefill else ()
    for phase, b, length in phases + (("decode", batch, ctx),):
        if phase == "decode" and pl.instance("decode").ffn_ranks:
            af = af_step(cfg, pl, system, batch=b, context=length, quant=scheme)
            for side, mem in (("decode", af.attention_memory), ("decode_experts", af.expert_memory)):
                require_fit(mem, f"{phase} ({side.replace('_', ' ')} side)", pl.provenance.file)
                mems[side] = mem
            steps[phase] = af.as_step()
            continue
        chunks = _chunks(length, pl.prefill_chunk if phase == "prefill" else 0, hit if phase == "prefill" else 0)
        timed = []
        for cached, size in chunks:
            step = shard(cfg, pl, phase, batch=b, length=size, quant=scheme, cached=cached)
            mem = memory(cfg, pl, step, scheme, system.chip_spec, length)
            require_fit(mem, phase, pl.provenance.file)
            timed.append(step_time(step, pl, system))
            mems[phase] = mem if phase not in mems or mem.total > mems[phase].total else mems[phase]
        steps[phase] = timed[0] if len(timed) == 1 else chained(timed)
        chunk_times[phase] = [t.time for t in timed]
        if not 0 < steps[phase].time < math.inf:  # e.g. --set hbm.bandwidth=1e-300B/s: times overflow to inf
            raise NpusimError(f"the {phase} step takes {steps[phase].time:g} s, which is not a time: a rate or size "
                              f"given ({', '.join(overrides or {}) or 'the files'}) is too small or too large to time")
    dies = system.chip_spec.dies
    dec = pl.instance("decode")
    decode_chips = (dec.ranks + dec.ffn_ranks) * dec.instances / dies
    transfer = kv_transfer(cfg, pl, system, scheme, input, chunk_times.get("prefill"), hit) if pl.disaggregated \
        else 0.0
    accepted = 1.0 + pl.mtp.acceptance
    tpot = steps["decode"].time / accepted
    chip = system.chip_spec
    # an AF step's two sides do different work per rank: its energy is not modelled
    energy = {p: step_energy(steps[p], chip) for p in steps} if chip.energy and af is None else {}
    joules = {"decode": energy["decode"].joules * dec.ranks * dec.instances / (batch * accepted)} if energy else {}
    prefill = {"prefill": None, "ttft": None, "prefill_chips": 0.0, "prefill_tokens_per_s_per_chip": None,
               "notes": (f"no TTFT: plan {pl.name} has no prefill instance (decode only; give it a prefill instance, "
                         "or colocated: true if its instance also prefills)",)}
    if "prefill" in steps:
        pre = pl.instance("prefill")
        prefill_chips = pre.ranks * pre.instances / dies
        prefill = {"prefill": steps["prefill"], "ttft": steps["prefill"].time + transfer,
                   "prefill_chips": prefill_chips,
                   "prefill_tokens_per_s_per_chip": prefill_batch * input / steps["prefill"].time / prefill_chips}
        if energy:
            joules["prefill"] = energy["prefill"].joules * pre.ranks / (prefill_batch * input)
    return Prediction(
        system=system.name, model=cfg.name, plan=pl.name, quant=scheme.name,
        scenario={"input": input, "output": output, "batch": batch, "prefill_batch": prefill_batch, "context": ctx,
                  "prefix_hit": prefix_hit},
        decode=steps["decode"], kv_transfer=transfer, tpot=tpot, decode_step=steps["decode"].time,
        decode_chips=decode_chips, memory=mems, tokens_per_s_per_chip=batch / tpot / decode_chips,
        overrides=dict(overrides or {}), energy=energy, joules_per_token=joules, af=af, **prefill)


def _chunks(length: int, chunk: int, cached: int = 0) -> list[tuple[int, int]]:
    """(cached, size) of each chunk of a prompt whose first `cached` tokens are in the cache already: the rest whole
    when `chunk` is 0 or not smaller."""
    if not chunk or chunk >= length - cached:
        return [(cached, length - cached)]
    return [(start, min(chunk, length - start)) for start in range(cached, length, chunk)]


def chained(steps: list[StepTime]) -> StepTime:
    """Chunks of a prefill run one after the other: their layers in sequence, each named by its chunk."""
    layers = tuple(dataclasses.replace(lt, name=f"chunk{i}.{lt.name}") for i, s in enumerate(steps) for lt in s.layers)
    return StepTime(steps[0].phase, sum(s.time for s in steps), layers)


def _check_plan(cfg: ModelConfig, pl: Plan, system: System) -> None:
    """Refuse a plan that does not divide the model or does not fit the system."""
    where = pl.provenance.file
    for name in pl.kernels:
        if name not in kernel_names():
            raise NpusimError("is not a kernel" + did_you_mean(name, kernel_names()),
                              **pl.provenance.where(f"kernels.{name}"))
    for role in ("prefill", "decode"):
        inst = getattr(pl, role)
        own = inst is not None and inst.streams is not None
        cores = (inst.streams if own else pl.streams).attention_cores
        if cores and cores >= system.chip_spec.aic.count:
            raise NpusimError(f"{cores} AIC must leave cores for the FFN/MoE stream ({system.chip_spec.name} has "
                              f"{system.chip_spec.aic.count}; 0 runs every kernel on all cores)",
                              **pl.provenance.where(f"{role}.streams.attention_cores" if own
                                                    else "streams.attention_cores"))
    for role in ("prefill", "decode"):
        inst = getattr(pl, role)
        if inst is None:
            continue
        checks = ((f"{role}.attention.tp", inst.attention.tp, cfg.num_attention_heads, "num_attention_heads"),
                  (f"{role}.moe.ep", inst.moe.ep, cfg.n_routed_experts + pl.eplb.redundant_experts,
                   "n_routed_experts + eplb.redundant_experts"),
                  (f"{role}.moe.tp", inst.moe.tp, cfg.moe_intermediate_size, "moe_intermediate_size"))
        for field, degree, total, what in checks:
            if total % degree:
                raise NpusimError(f"{degree} does not divide the model's {what} ({total})", file=where, field=field)
        if inst.pp > cfg.num_hidden_layers:  # an uneven split is SGLang's get_pp_indices (parallel.step)
            raise NpusimError(f"{inst.pp} pipeline stages exceed the model's {cfg.num_hidden_layers} layers",
                              file=where, field=f"{role}.pp")
        if cfg.intermediate_size and cfg.intermediate_size % inst.dense_tp:
            raise NpusimError(f"{inst.dense_tp} does not divide intermediate_size ({cfg.intermediate_size})",
                              file=where, field=f"{role}.dense_tp")
    if cfg.is_v4 and pl.prefill_attention.kernel != "sparse":
        raise NpusimError(f"{cfg.name} has no MHA-mode prefill (V4 attention has one form); use sparse", file=where,
                          field="prefill_attention.kernel")
    if pl.mtp.draft and pl.mtp.depth:
        load_draft(pl.mtp.draft, file=where)
    if pl.ranks > system.ranks:
        raise NpusimError(f"the plan needs {pl.ranks} ranks but {system.name} has {system.ranks}", file=where,
                          field="ranks")


def kv_transfer(cfg: ModelConfig, pl: Plan, system: System, scheme, input: int,
                chunk_times: list[float] | None = None, cached: int = 0) -> float:
    """Seconds one request's caches (`input` tokens, the first `cached` already held on both sides) still take to
    reach the decode rank once its prefill ends: the slowest of sender egress, link and receiver ingress
    (`parallel.transfer`), each prefill chunk sent as its forward ends (`chunk_times`: the chunks' step times in
    order; None: one chunk)."""
    path = kv_path(cfg, pl, system, scheme)
    chunks = _chunks(input, pl.prefill_chunk, cached)
    ends = itertools.accumulate(chunk_times or [0.0] * len(chunks))
    return exposed(path, [(size, end) for (_, size), end in zip(chunks, ends)])
