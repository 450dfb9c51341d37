"""Chrome Trace Event Format export (opens in Perfetto and chrome://tracing): a process per core, a thread per pipe.

Kernels of a sequence are laid end to end, each preceded by its launch overhead on a "host" track. Steady-state
jumps appear as one "steady state xN" span per pipe: those iterations were extrapolated, not simulated one by one.
"""

from __future__ import annotations

import json
from pathlib import Path

from npusim.engine.result import Timeline

US = 1e6  # the format counts microseconds


def chrome_events(timelines: list[Timeline]) -> list[dict]:
    events: list[dict] = []
    pids: dict[str, int] = {"host": 0}
    tids: dict[tuple[str, str], int] = {}
    events.append(_meta("process_name", 0, 0, "host"))
    events.append(_meta("thread_name", 0, 0, "launch"))
    offset = 0.0
    for tl in timelines:
        ids = []
        for core, pipe in tl.tracks:
            if core not in pids:
                pids[core] = len(pids)
                events.append(_meta("process_name", pids[core], 0, core))
                events.append({"name": "process_sort_index", "ph": "M", "pid": pids[core], "tid": 0,
                               "args": {"sort_index": pids[core]}})
            if (core, pipe) not in tids:
                tids[core, pipe] = len(tids) + 1
                events.append(_meta("thread_name", pids[core], tids[core, pipe], pipe.upper()))
            ids.append((pids[core], tids[core, pipe]))
        if tl.launch:
            events.append({"name": f"launch {tl.kernel}", "ph": "X", "pid": 0, "tid": 0,
                           "ts": offset * US, "dur": tl.launch * US})
        start = offset + tl.launch
        end = start
        for track, op, t0, t1 in tl.spans:
            pid, tid = ids[track]
            events.append({"name": op, "cat": tl.kernel, "ph": "X", "pid": pid, "tid": tid,
                           "ts": (start + t0) * US, "dur": (t1 - t0) * US})
            end = max(end, start + t1)
        offset = end
    return events


def write_chrome_trace(timelines: list[Timeline], path: str | Path) -> None:
    Path(path).write_text(json.dumps({"traceEvents": chrome_events(timelines), "displayTimeUnit": "ns"}))


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
