"""The defaults and choices the subcommands' --help shows, held without importing the layers that own them.

Building the parser (every `npusim --help`, `--version` and subcommand `--help`) must not load the engine, pandas or
matplotlib (issue 30: a --help answers at once), yet argparse needs these values when the parser is built.
Each constant below mirrors its owner's, named beside it; tests/test_startup.py asserts every one equals the owner's,
so a change there fails that test until it is made here too. The owners could import them from a light module of
their own layer instead, and this file would then re-export them.
"""

from __future__ import annotations

# npusim.api.DEFAULT: the bundled scenario, DeepSeek-V3.2-Exp BF16 at 128K on CloudMatrix384 with the A17 plans
SCENARIO = {"hw": "cloudmatrix384", "model": "deepseek-v3.2-exp", "plan": "v32-a3-pd-a17", "input": 131072,
            "output": 1024, "batch": 256, "quant": "bf16"}

# npusim.serving.deployment.SCHEDULERS; npusim.serving.predicted.MAX_BATCH, TOKEN_BUDGET
SCHEDULERS = ("vllm", "sglang")
MAX_BATCH = 64
TOKEN_BUDGET = 16384

# npusim.graph.PHASES: the phases a model graph is built for
PHASES = ("prefill", "decode")

# npusim.engine.l2state.L2_STATES; npusim.engine.result.LAUNCH_MODES
L2_STATES = ("cold", "warm")
LAUNCH_MODES = ("eager", "graph", "device", "none")

# npusim.planner.search.PERCENTILES and the defaults of npusim.planner.search.Traffic
PERCENTILES = ("mean", "p50", "p90", "p99")
TRAFFIC = {"percentile": "p99", "requests": 200, "seed": 0}

# The owner of each mirror above but TRAFFIC (the test reads Traffic's fields), for tests/test_startup.py:
# name here -> (module, attribute).
OWNERS = {"SCENARIO": ("npusim.api", "DEFAULT"), "SCHEDULERS": ("npusim.serving.deployment", "SCHEDULERS"),
          "MAX_BATCH": ("npusim.serving.predicted", "MAX_BATCH"),
          "TOKEN_BUDGET": ("npusim.serving.predicted", "TOKEN_BUDGET"), "PHASES": ("npusim.graph", "PHASES"),
          "L2_STATES": ("npusim.engine.l2state", "L2_STATES"), "LAUNCH_MODES": ("npusim.engine.result", "LAUNCH_MODES"),
          "PERCENTILES": ("npusim.planner.search", "PERCENTILES")}
