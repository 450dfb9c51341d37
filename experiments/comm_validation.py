"""Regenerate the communication validation table: predicted vs published (K01, K07, K08, K11, K25-K27).

Run: python experiments/comm_validation.py   -> experiments/results/comm_validation.{csv,md}
Rows marked `fit` were used to fit a parameter of the chip: K11 / K26 `efficiency.link`, K07 (bulk all-to-all,
DeepEP normal mode) `efficiency.bulk_all_to_all` and `overheads.all_to_all_peer` (experiments/calibrate.py); the
others are predictions.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from npusim.parallel.collectives import Collective, collective_time
from npusim.spec.system import load_system

OUT = Path(__file__).parent / "results"
GB = 1e9
SIZE = 1 << 30  # large-message regime of the microbenchmarks (their sizes are not all stated)
DEEPEP_NORMAL = 4096 * 8 * 7168  # 4,096 tokens x top-8 x hidden 7,168, INT8 dispatch (bytes one rank sends)
LOW_LATENCY = 128 * 8 * 7168
K07 = ((8, 146, 125), (16, 107, 103), (32, 102, 95), (64, 81, 91), (128, 57, 81))  # EP, dispatch / combine GB/s


def deepep_normal(system, ep: int) -> tuple[float, float]:
    """Bottleneck bandwidths (GB/s) of a DeepEP normal-mode dispatch (INT8) and combine (BF16) over `ep` ranks."""
    return tuple(DEEPEP_NORMAL * scale / collective_time(Collective("all_to_all", DEEPEP_NORMAL * scale, ep, bulk=True),
                                                         system).time / GB for scale in (1, 2))


def rows():
    a2, cm = load_system("atlas-800-a2"), load_system("cloudmatrix384")

    def bw(system, kind, size, group, stride=1):
        return collective_time(Collective(kind, size, group, stride), system).alg_bandwidth / GB

    def lat(system, kind, size, group):
        return collective_time(Collective(kind, size, group), system).time * 1e6

    for g, ag, ar in ((2, 38, 18), (4, 64, 30), (8, 149, 72)):
        yield "K11", f"910B all_gather {g} cards", "GB/s", ag, bw(a2, "all_gather", SIZE, g), "fit"
        yield "K11", f"910B all_reduce {g} cards", "GB/s", ar, bw(a2, "all_reduce", SIZE, g), "fit"
    yield "K25", "910B HCCS P2P (ascend-dmi, 2 cards)", "GB/s", 54.68, bw(a2, "p2p", SIZE, 2), "predict"
    yield "K27", "910B HIXL HCCS D2D write, single pair", "GB/s", 19.4, bw(a2, "p2p", 8 << 20, 2), "predict"
    for label, stride, w, r in (("intra-node", 2, 124, 148), ("inter-node", 16, 120, 143)):
        yield "K26", f"A3 HIXL D2D {label} write (8 MB)", "GB/s", w, bw(cm, "p2p", 8 << 20, 2, stride), "fit"
        yield "K26", f"A3 HIXL D2D {label} read (8 MB)", "GB/s", r, bw(cm, "p2p", 8 << 20, 2, stride), "fit"
    for ep, d, c in K07:
        dispatch, combine = deepep_normal(cm, ep)
        yield "K07", f"A3 DeepEP normal dispatch EP{ep} (INT8)", "GB/s", d, dispatch, "fit"
        yield "K07", f"A3 DeepEP normal combine EP{ep} (BF16)", "GB/s", c, combine, "fit"
    for ep, d, c in ((8, 132, 126), (16, 139, 135), (32, 153, 151)):
        yield "K08", f"A3 DeepEP low-latency dispatch EP{ep}", "us", d, lat(cm, "all_to_all", LOW_LATENCY, ep), "predict"
        yield "K08", f"A3 DeepEP low-latency combine EP{ep}", "us", c, lat(cm, "all_to_all", 2 * LOW_LATENCY, ep), "predict"
    for ep, d, c in ((8, 116, 118), (256, 152, 149)):
        yield "K01", f"CM384 FusedDispatch EP{ep} (128 tok)", "us", d, lat(cm, "all_to_all", LOW_LATENCY, ep), "predict"
        yield "K01", f"CM384 FusedCombine EP{ep} (128 tok)", "us", c, lat(cm, "all_to_all", 2 * LOW_LATENCY, ep), "predict"


def table() -> pd.DataFrame:
    frame = pd.DataFrame(rows(), columns=["id", "measurement", "unit", "published", "predicted", "use"])
    frame["predicted"] = frame["predicted"].round(1)
    frame["error %"] = (100 * (frame["predicted"] - frame["published"]) / frame["published"]).round(1)
    return frame


def main() -> None:
    OUT.mkdir(exist_ok=True)
    frame = table()
    frame.to_csv(OUT / "comm_validation.csv", index=False)
    err = frame["error %"].abs()
    summary = (f"\n\nmedian |error| {err.median():.1f} % (fit rows {err[frame.use == 'fit'].median():.1f} %, "
               f"predicted rows {err[frame.use == 'predict'].median():.1f} %); worst {err.max():.1f} %\n")
    (OUT / "comm_validation.md").write_text("# Communication: predicted vs published\n\n"
                                            + frame.to_markdown(index=False) + summary)
    print(frame.to_string(index=False) + summary)


if __name__ == "__main__":
    main()
