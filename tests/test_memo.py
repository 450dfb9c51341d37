"""The memos a sweep shares between its points return exactly what an unmemoised run computes, and their keys tell
apart every field that changes a result (a perturbed field the result read is a miss, never a stale hit)."""

import dataclasses
import gc

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npusim
from npusim.engine import layout
from npusim.engine.sim import Simulation
from npusim.errors import NpusimError
from npusim.graph.ops import Op
from npusim.kernels.catalog import kernel
from npusim.kernels.trace import Loop
from npusim.parallel import optime, shard, step
from npusim.spec import catalog
from npusim.spec.chip import CHIPS, load_chip
from npusim.spec.reads import ReadsMemo, resolve
from npusim.spec.system import load_system
from npusim.sweeps import run as sweep_run
from npusim.sweeps.run import forget
A16 = {"hw": "cloudmatrix384", "model": "deepseek-v3.1", "plan": "r1-a3-decode-a16", "output": 1024,
       "quant": "w8a8c8"}
GRID = {"batch": [1024, 3072], "hbm.bandwidth": ["1.4TB/s", "2.6TB/s"], "input": [1024, 4096]}


@pytest.fixture
def no_disk_cache(monkeypatch):
    monkeypatch.setenv("NPUSIM_CACHE", "off")


def test_memoised_sweep_is_bit_identical_to_unmemoised(no_disk_cache, monkeypatch):
    """The small A16 grid run point after point with the memos shared equals each point run from empty memos."""
    forget()
    shared = npusim.sweep(base=A16, grid=GRID, workers=1, cache="off", progress=False)
    real = sweep_run.evaluate

    def cold(point):
        forget()
        return real(point)

    monkeypatch.setattr(sweep_run, "evaluate", cold)
    alone = npusim.sweep(base=A16, grid=GRID, workers=1, cache="off", progress=False)
    assert (shared["error"] == "").all() and shared["tpot_s"].nunique() == len(shared)
    pd.testing.assert_frame_equal(shared, alone, check_exact=True)


def test_memo_entries_hold_no_reference_cycles(no_disk_cache):
    """A sweep freezes what each point leaves in the memos (sweeps.run.collecting): entries are freed by reference
    counting when dropped, so none may sit in a reference cycle (a frozen cycle would never be freed)."""
    forget()
    points = sweep_run.SweepSpec("t", A16, {"batch": [1024], "input": [1024, 4096]}).expand()
    gc.collect()  # what was garbage before the run is not the run's (collecting freezes what lives when it starts)
    with sweep_run.collecting():
        rows = [sweep_run.evaluate_collected(p) for p in points]
        assert gc.get_freeze_count() > 0 and not any(r["error"] for r in rows)
        forget()
        gc.unfreeze()
        assert gc.collect() == 0


def test_trace_memo_is_shared_across_a_rate_it_does_not_read():
    """A decode attention's tiling reads no HBM figure: the second bandwidth reuses the first one's trace."""
    k = kernel("flash_attention", {"tokens": 32, "keys": 4609, "heads": 128, "d_qk": 576, "d_v": 512, "kv_heads": 1},
               dtype="bf16", causal=0)
    slow, fast = (load_system("cloudmatrix384", {"hbm.bandwidth": bw}).chip_spec for bw in ("1.4TB/s", "2.6TB/s"))
    memo = ReadsMemo()
    first = memo.get("fa", slow, k.trace)
    again = memo.get("fa", fast, k.trace)
    assert memo.misses == 1 and memo.hits == 1 and again is first
    assert again == k.trace(fast)


KERNELS = {
    "flash_attention": ({"tokens": 32, "keys": 1025, "heads": 128, "d_qk": 576, "d_v": 512, "kv_heads": 1},
                        {"dtype": "bf16", "causal": 0}),
    "gemm": ({"m": 64, "n": 1536, "k": 7168}, {"dtype": "bf16"}),
    "quant_matmul": ({"m": 32, "n": 2112, "k": 7168}, {}),
    "swiglu": ({"rows": 32, "width": 2048}, {}),
}


def _read_fields(name: str, chip) -> list[str]:
    shape, opts = KERNELS[name]
    memo = ReadsMemo()
    memo.get(name, chip, kernel(name, shape, **opts).trace)
    (reads, _), = next(iter(memo._entries.values()))
    return [path for path, value in reads if isinstance(value, (int, float, dict)) and not isinstance(value, bool)]


def _perturbed(spec, path: str, factor: float):
    """`spec` with the number at `path` (or every number of the table at `path`) scaled by `factor`."""
    head, _, rest = path.partition(".")
    value = getattr(spec, head)
    if rest:
        return dataclasses.replace(spec, **{head: _perturbed(value, rest, factor)})
    if isinstance(value, dict):
        new = {k: (type(v)(v * factor) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
               for k, v in value.items()}
    else:
        new = type(value)(value * factor) if isinstance(value, float) else max(1, round(value * factor))
    return dataclasses.replace(spec, **{head: new})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(KERNELS)), st.data(), st.sampled_from([0.5, 0.75, 1.5, 2.0]))
def test_a_perturbed_field_the_tiling_read_is_a_miss_not_a_stale_hit(name, data, factor):
    chip = load_system("cloudmatrix384").chip_spec
    path = data.draw(st.sampled_from(_read_fields(name, chip)))
    try:
        other = _perturbed(chip, path, factor)
    except (TypeError, ValueError):
        return  # a table of tuples (fractal shapes): not a number to scale
    if resolve(other, path) == resolve(chip, path):
        return  # a count that rounds back to itself
    shape, opts = KERNELS[name]
    k = kernel(name, shape, **opts)
    memo = ReadsMemo()
    memo.get(name, chip, k.trace)
    try:
        fresh = k.trace(other)
    except NpusimError:
        return  # the perturbed chip refuses the tiling (e.g. a smaller buffer): nothing to memoise
    assert memo.get(name, other, k.trace) == fresh
    assert memo.misses == 2, f"{path} x{factor} reused {name}'s trace built on the unperturbed chip"


def test_a_field_the_engine_reads_moves_the_kernel_time():
    """op_time's key holds the whole chip: a rate the simulation reads is a new result, not the first one's."""
    op = Op(name="x", kind="gemm", unit="cube", shape={"m": 64, "n": 1536, "k": 7168},
                             dtypes={"a": "bf16", "b": "bf16"}, flops=2 * 64 * 1536 * 7168, bytes_read=7168 * 1536 * 2,
                             bytes_written=64 * 1536 * 2, weight_bytes=7168 * 1536 * 2)
    chip = load_system("cloudmatrix384").chip_spec
    base = optime.op_time(op, chip).time
    for path in ("hbm.bandwidth", "efficiency.hbm", "clock", "overheads.graph_launch"):
        assert optime.op_time(op, _perturbed(chip, path, 2.0)).time != base, path


def _first_loop(trace, change):
    """The trace with its first group's AIC program's first loop changed by `change` (a Loop -> a Loop)."""
    g = trace.groups[0]
    body = g.aic.body
    i = next(i for i, n in enumerate(body) if isinstance(n, Loop))
    aic = dataclasses.replace(g.aic, body=body[:i] + (change(body[i]),) + body[i + 1:])
    return dataclasses.replace(trace, groups=(dataclasses.replace(g, aic=aic),) + trace.groups[1:])


def _first_instruction(loop, **fields):
    return dataclasses.replace(loop, body=(dataclasses.replace(loop.body[0], **fields),) + loop.body[1:])


def test_engine_layout_is_shared_by_structure_and_missed_by_a_field_the_engine_reads():
    """The engine lays a trace out once per structure (engine.layout): a copy whose instructions carry no
    functional action shares it; another loop count, instruction size, initial flag count or group fold is a new
    layout, and each times exactly as from an empty memo."""
    chip = load_chip("910b2")
    trace = kernel("gemm", {"m": 256, "n": 512, "k": 1024}).trace(chip)
    g = trace.groups[0]
    flag = next(iter(g.flags))
    variants = [_first_loop(trace, lambda loop: dataclasses.replace(loop, count=loop.count + 1)),
                _first_loop(trace, lambda loop: _first_instruction(loop, bytes=loop.body[0].bytes + 64)),
                dataclasses.replace(trace, groups=(dataclasses.replace(g, flags=g.flags | {flag: 1}),)),
                dataclasses.replace(trace, groups=(dataclasses.replace(g, copies=g.copies - 1),))]
    layout.clear()
    laid = layout.layout(trace)
    assert layout.layout(_first_loop(trace, lambda loop: _first_instruction(loop, action=None))) is laid
    for variant in variants:
        assert layout.layout(variant) is not laid
        warm = Simulation(variant, chip).run()
        layout.clear()
        cold = Simulation(variant, chip).run()
        assert (warm.time, warm.events) == (cold.time, cold.events)
        laid = layout.layout(trace)


def test_spec_memo_sees_a_rewritten_file(bad_chip):
    """A chip file rewritten between two loads (same size, within a timestamp tick) is loaded afresh."""
    path = bad_chip("inherits: 910c-die\nclock: {value: 1.5 GHz, source: test}\n")
    first = load_chip(path)
    bad_chip("inherits: 910c-die\nclock: {value: 1.6 GHz, source: test}\n")
    assert load_chip(path).clock == 1.6e9 != first.clock


def test_pinned_files_are_read_once_until_unpinned(bad_chip):
    """A sweep pins its spec files (catalog.pin_files): a file rewritten while pinned is not re-read, as the sweep's
    point cache takes one fingerprint of the files; unpinned, the rewrite is seen."""
    path = bad_chip("inherits: 910c-die\nclock: {value: 1.5 GHz, source: test}\n")
    catalog.pin_files()
    try:
        first = load_chip(path)
        bad_chip("inherits: 910c-die\nclock: {value: 1.6 GHz, source: test}\n")
        assert load_chip(path) is first
    finally:
        catalog.pin_files(False)
    assert load_chip(path).clock == 1.6e9


def test_pinned_directories_are_listed_once_until_unpinned(tmp_path, monkeypatch):
    """While pinned, a catalog directory is listed once (load_system checks its chip's name at every point); a file
    added meanwhile is listed once unpinned."""
    (tmp_path / "hardware" / "chips").mkdir(parents=True)
    (tmp_path / "hardware" / "chips" / "a.yaml").write_text("")
    monkeypatch.setenv("NPUSIM_HOME", str(tmp_path))
    catalog.pin_files()
    try:
        assert CHIPS.names() == ["a"]
        (tmp_path / "hardware" / "chips" / "b.yaml").write_text("")
        assert CHIPS.names() == ["a"]
    finally:
        catalog.pin_files(False)
    assert CHIPS.names() == ["a", "b"]


def test_rank_step_memo_hits_on_equal_content_and_misses_on_a_field_the_step_reads():
    """shard is memoised by the content of the model, plan, quantisation, phase and scenario: the same content is
    the same step; another batch, context or MTP depth is a new one, equal to a step cut from empty memos."""
    setup = npusim.api.load_setup(A16["hw"], A16["model"], A16["plan"], A16["quant"])
    cfg, pl, quant = setup.model, setup.plan, setup.quant
    args = dict(batch=2048, length=4608, quant=quant)
    forget()
    first = shard.shard(cfg, pl, "decode", **args)
    assert shard.shard(cfg, pl, "decode", **args) is first
    deeper = dataclasses.replace(pl, mtp=dataclasses.replace(pl.mtp, depth=pl.mtp.depth + 1))
    for variant in ((pl, dict(args, batch=3072)), (pl, dict(args, length=4609)), (deeper, args)):
        step = shard.shard(cfg, variant[0], "decode", **variant[1])
        assert step is not first
        forget()
        assert shard.shard(cfg, variant[0], "decode", **variant[1]) == step


def test_layer_memo_hits_where_a_layer_does_not_look_and_misses_where_it_does(no_disk_cache):
    """The MTP acceptance changes TPOT, not a layer: every layer is a hit. The scale-up link's bandwidth moves the
    layers' collectives: a miss, and the same figures as from empty memos."""
    args = dict(A16, input=4096, batch=2048)
    hw, model, plan = args.pop("hw"), args.pop("model"), args.pop("plan")
    forget()
    first = npusim.predict(hw, model, plan, **args)
    hits = step._layers.hits
    other = npusim.predict(hw, model, plan, **args, overrides={"plan.mtp.acceptance": "0.8"})
    assert step._layers.hits == hits + len(first.decode.layers)
    assert other.decode_step == first.decode_step and other.tpot < first.tpot
    link = {"tiers.ub.bandwidth": "100GB/s"}
    slower = npusim.predict(hw, model, plan, **args, overrides=link)
    assert slower.decode_step > first.decode_step
    forget()
    assert npusim.predict(hw, model, plan, **args, overrides=link).decode_step == slower.decode_step
