"""Every kernel's trace over the golden shapes equals, in canonical form, the one recorded before the tile-program
rewrite, and the engine times it to the last bit (tests/golden.py says how to see what differs)."""

import json

import pytest

from golden import CASES, DATA, build, canonical, case_id, digest, engine_record

RECORDED = json.loads(DATA.read_text())["cases"]


@pytest.mark.slow  # 111 traces built and timed; the slow tier (pytest -m slow), which .ci/run runs too
@pytest.mark.parametrize("case", CASES, ids=[case_id(*c) for c in CASES])
def test_trace_and_engine_result_are_the_recorded_ones(case):
    kernel, shape, chip, buffering = case
    want = RECORDED[case_id(*case)]
    trace = build(kernel, shape, chip, buffering)
    assert digest(canonical(trace)) == want["digest"], f"run: python tests/golden.py diff '{case_id(*case)}'"
    assert engine_record(trace, chip) == want["engine"]


def test_every_registered_kernel_has_golden_shapes():
    from npusim.kernels.catalog import names

    assert set(names()) <= {c[0] for c in CASES}


def test_canonical_form_sees_flag_semantics_not_names():
    """Renaming a group's flags keeps the digest; one instruction waiting on another flag, or another initial
    count, changes it (else the test above could not fail)."""
    import dataclasses

    from npusim.kernels.trace import Loop, walk

    trace = build("gemm", {"m": 64, "n": 64, "k": 64}, "910b2", 0)

    def mapped(f, flags=dict):
        def body(nodes):
            return tuple(dataclasses.replace(n, body=body(n.body)) if isinstance(n, Loop) else f(n) for n in nodes)

        return dataclasses.replace(trace, groups=tuple(dataclasses.replace(
            g, aic=dataclasses.replace(g.aic, body=body(g.aic.body)), flags=flags(g.flags)) for g in trace.groups))

    base = digest(canonical(trace))
    renamed = mapped(lambda n: dataclasses.replace(n, wait=tuple("x" + f for f in n.wait),
                                                   set=tuple("x" + f for f in n.set)),
                     lambda fl: {"x" + k: v for k, v in fl.items()})
    assert digest(canonical(renamed)) == base
    load = next(n for n, _ in walk(trace.groups[0].aic.body) if "l1.free" in n.wait)
    moved = mapped(lambda n: dataclasses.replace(n, wait=("l0.free",)) if n is load else n)
    assert digest(canonical(moved)) != base
    assert digest(canonical(mapped(lambda n: n, lambda fl: {**fl, "l0c.free": 1}))) != base
