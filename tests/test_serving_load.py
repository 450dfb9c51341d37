"""Load generation for the serving simulation: trace files, length distributions, arrival processes, figures."""

import io
import sys

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.serving import (AnalyticStepModel, Capacity, ClosedLoop, Deployment, Fixed, LogNormal, OpenLoop, Pool,
                            Sampled, Slo, Uniform, knee, read_trace, simulate)
from npusim.serving.plots import latency_cdfs, rate_sweep, timeline

MODEL = AnalyticStepModel(Capacity(kv_bytes_per_token=70e3, kv_capacity=10e9, max_batch=8, token_budget=4096))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_and_jsonl_traces_replay_at_their_arrival_times(tmp_path):
    csv = write(tmp_path, "t.csv", "arrival,input,output,prefix_hit\n0.0,1000,20,0\n0.5,2000,10,1500\n2.0,300,5,\n")
    jsonl = write(tmp_path, "t.jsonl", '{"arrival": 0.0, "input": 1000, "output": 20, "prefix_hit": 0}\n\n'
                                      '{"arrival": 0.5, "input": 2000, "output": 10, "prefix_hit": 1500}\n'
                                      '{"arrival": 2.0, "input": 300, "output": 5}\n')
    a, b = read_trace(csv), read_trace(jsonl)
    assert a.arrival == b.arrival == (0.0, 0.5, 2.0) and a.prefix_hit == b.prefix_hit == (0, 1500, 0)
    r = simulate(Deployment(), a, MODEL).requests  # a trace runs to its end by default
    assert r.arrival.tolist() == [0.0, 0.5, 2.0] and r.prefix_hit.tolist() == [0, 1500, 0]
    assert r.finish.notna().all()
    assert len(simulate(Deployment(), a, MODEL, requests=2).requests) == 2


@pytest.mark.parametrize("name, text, line, words", [
    ("bad.csv", "arrival,input,output\n0,100,10\n1,abc,10\n", 3, "input 'abc' is not a token count"),
    ("bad.csv", "arrival,input,output\n0,100,10\n1,100\n", 3, "missing output"),
    ("bad.csv", "arrival,input,output\n0,100,10\n1,100,10,7\n", 3, "has 4 fields, the header has 3"),
    ("bad.csv", "arrival,input\n0,100\n", 1, "missing output"),
    ("bad.csv", "arrival,input,output\n2,100,10\n1,100,10\n", 3, "sort the trace"),
    ("bad.csv", "arrival,input,output,prefix_hit\n0,100,10,100\n", 2, "prefix_hit 100 must be below input 100"),
    ("bad.csv", "arrival,input,output\n-1,100,10\n", 2, "finite time >= 0"),
    ("bad.csv", "arrival,input,output\n0,100,0\n", 2, "output '0' must be a whole number >= 1"),
    ("bad.jsonl", '{"arrival": 0, "input": 5, "output": 5}\n{"arrival": 1, "input": 5,\n', 2, "is not valid JSON"),
    ("bad.jsonl", '[0, 5, 5]\n', 1, "must be a JSON object"),
    ("bad.jsonl", '{"arrival": 0, "input": 5.5, "output": 5}\n', 1, "input 5.5 must be a whole number"),
])
def test_a_malformed_trace_names_the_file_and_line(tmp_path, name, text, line, words):
    path = write(tmp_path, name, text)
    with pytest.raises(NpusimError) as err:
        read_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}: line {line}: ") and words in message


def test_missing_or_empty_trace_files(tmp_path):
    with pytest.raises(NpusimError, match="cannot read the file"):
        read_trace(tmp_path / "absent.csv")
    with pytest.raises(NpusimError, match="no requests"):
        read_trace(write(tmp_path, "empty.csv", "arrival,input,output\n"))


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert (Fixed(7).sample(rng, 5) == 7).all()
    u = Uniform(10, 20).sample(rng, 10000)
    assert u.min() == 10 and u.max() == 20
    ln = LogNormal(1000, 1.0, high=50000).sample(rng, 20000)
    assert np.median(ln) == pytest.approx(1000, rel=0.05) and ln.max() <= 50000 and ln.min() >= 1
    s = Sampled((3, 9)).sample(rng, 1000)
    assert set(s.tolist()) == {3, 9}
    with pytest.raises(NpusimError, match="low <= high"):
        Uniform(5, 2)


@pytest.mark.parametrize("cv", [1.0, 3.0])
def test_open_loop_arrivals_have_the_asked_rate_and_burstiness(cv):
    arrivals = OpenLoop(50.0, Fixed(1), Fixed(1), cv=cv).arrivals(np.random.default_rng(0))
    times = np.array([next(arrivals)[0] for _ in range(20000)])
    gaps = np.diff(times)
    assert 1 / gaps.mean() == pytest.approx(50.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_closed_loop_keeps_the_concurrency():
    result = simulate(Deployment(prefill=Pool(ranks=2)), ClosedLoop(6, Uniform(200, 800), Fixed(30)), MODEL,
                      seed=0, requests=120)
    assert result.mean_in_system == pytest.approx(6, rel=0.05)
    assert result.requests.finish.notna().all()


def test_figures_render_headless(tmp_path):
    result = simulate(Deployment(), OpenLoop(5.0, Fixed(500), Fixed(20)), MODEL, seed=0, requests=50,
                      slo=Slo(ttft=0.2, tpot=0.02))
    for fig, name in ((latency_cdfs(result), "cdf.png"), (timeline(result), "timeline.png")):
        fig.savefig(tmp_path / name)
        assert (tmp_path / name).stat().st_size > 10000


def test_a_rate_sweep_shows_the_knee(tmp_path):
    rates = [4.0, 12.0, 20.0, 30.0]
    slo = Slo(ttft=0.5, tpot=0.02)
    summaries = [simulate(Deployment(prefill=Pool(ranks=2)), OpenLoop(rate, Fixed(1024), Fixed(64)), MODEL, seed=0,
                          requests=300, slo=slo).summary for rate in rates]
    p99 = [s.ttft.p99 for s in summaries]
    assert p99[0] < slo.ttft < p99[-1] and p99 == sorted(p99)
    assert summaries[-1].flat()["ttft_p99"] == p99[-1]
    rate_sweep(rates, summaries, slo).savefig(tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10000


def test_progress_shows_on_a_terminal_only(capsys, monkeypatch):
    """A tqdm bar on a terminal's stderr, cleared when the run ends; nothing at all on a pipe (captured output holds
    only results)."""
    load = OpenLoop(5.0, Fixed(200), Fixed(5))
    simulate(Deployment(), load, MODEL, seed=0, requests=200, progress=True)
    assert capsys.readouterr().err == ""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    simulate(Deployment(), load, MODEL, seed=0, requests=200, progress=True)
    shown = term.getvalue()
    assert "serving:" in shown and "/200" in shown and shown.endswith("\r") and "\n" not in shown


def test_the_knee_uses_the_whole_slo():
    """TTFT p99 is met at every rate but TPOT p99 at none: the knee is the first rate (was: 'TTFT stays within')."""
    rates = [4.0, 12.0]
    slo = Slo(ttft=60.0, tpot=1e-6)
    summaries = [simulate(Deployment(prefill=Pool(ranks=2)), OpenLoop(rate, Fixed(1024), Fixed(64)), MODEL, seed=0,
                          requests=100, slo=slo).summary for rate in rates]
    assert all(s.ttft.p99 <= slo.ttft and s.misses(slo) == ("tpot",) for s in summaries)
    assert knee(rates, summaries, slo) == 4.0
    assert knee(rates, summaries, Slo(ttft=60.0)) is None


def test_steady_throughput_leaves_out_the_drain():
    """Output tokens/s from the first to the last arrival, counted token by token. Long answers at a rate the ranks
    carry: after the last arrival the batch drains for ~40 % of the run, which the whole window averages in."""
    result = simulate(Deployment(prefill=Pool(ranks=2)), OpenLoop(2.0, Fixed(1024), Fixed(512)), MODEL, seed=0,
                      requests=20)
    s, r = result.summary, result.requests
    start, end = r.arrival.min(), r.arrival.max()
    assert s.steady_window == pytest.approx(end - start)
    times, tokens = result.emissions[:, 0], result.emissions[:, 1]
    assert tokens.sum() == r.generated.sum()  # every token emitted once
    inside = tokens[(times >= start) & (times <= end)].sum()
    assert s.steady_output_throughput == pytest.approx(inside / (end - start))
    assert s.window > 1.6 * s.steady_window and s.steady_output_throughput > 1.1 * s.output_throughput
    one = simulate(Deployment(), OpenLoop(1.0, Fixed(256), Fixed(8)), MODEL, seed=0, requests=1).summary
    assert one.steady_window == one.window and one.steady_output_throughput == pytest.approx(one.output_throughput)
