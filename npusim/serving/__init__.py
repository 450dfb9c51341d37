"""Request-level serving simulation: a deployment under a load, with step times from a StepModel.

    from npusim.serving import *
    model = AnalyticStepModel(Capacity(kv_bytes_per_token=70e3, kv_capacity=30e9, max_batch=64, token_budget=8192))
    load = OpenLoop(rate=4.0, input=Fixed(2048), output=Fixed(256))
    result = simulate(Deployment(prefill=Pool(instances=2, ranks=4)), load, GridStepModel(model), seed=1,
                      requests=1000, slo=Slo(ttft=2.0, tpot=0.05))
    result.summary, result.latency_table(), result.requests, result.steps
"""

from npusim.serving.deployment import Deployment, Link, Mtp, Pool, Scheduler
from npusim.serving.load import ClosedLoop, Fixed, LogNormal, OpenLoop, Sampled, Trace, Uniform, read_trace
from npusim.serving.result import Percentiles, ServingResult, Slo, Summary, knee
from npusim.serving.sim import simulate
from npusim.serving.stepmodel import AnalyticStepModel, Capacity, GridStepModel, StepModel

__all__ = ["AnalyticStepModel", "Capacity", "ClosedLoop", "Deployment", "Fixed", "GridStepModel", "Link", "LogNormal",
           "Mtp", "OpenLoop", "Percentiles", "Pool", "Sampled", "Scheduler", "ServingResult", "Slo", "StepModel",
           "Summary", "Trace", "Uniform", "knee", "read_trace", "simulate"]
