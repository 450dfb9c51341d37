"""npusim: performance simulator and cost model of Huawei Ascend NPUs running sparse-attention LLMs.

The public API (`dir(npusim)` lists it; each is imported on first use):

    predict(hw, model, plan, input=, output=, batch=, ...) -> Prediction   one deployment's TTFT, TPOT, memory, ops
    compare(base, *variants) -> Comparison                                  scenarios side by side, a waterfall
    sweep(spec | base=, grid=, points=) -> DataFrame                        a grid or list of points
    plan(hw, model, input=, output=, slo=Slo(...)) -> SearchResult          plans meeting an SLO, their frontier
    cost(prediction, CostParams()) -> Cost                                  $ per million tokens, J per token
    check(baseline) -> regression check of recorded predictions
    launch(framework, plan, model, quant, system, Limits(...)) -> Launch    vLLM-Ascend / SGLang launch commands
    functional                                                              the kernels' numerics on NumPy arrays
"""

# The public API, imported on first use so that `import npusim` (and every CLI start) stays light.
_PUBLIC = {"predict": ("npusim.api", "predict"), "sweep": ("npusim.sweeps", "sweep"),
           "plan": ("npusim.planner", "search"), "Slo": ("npusim.serving", "Slo"),
           "cost": ("npusim.results.cost", "cost"), "CostParams": ("npusim.results.cost", "CostParams"),
           "check": ("npusim.checks", "check"), "compare": ("npusim.results.compare", "compare"),
           "Prediction": ("npusim.results.prediction", "Prediction"),
           "Comparison": ("npusim.results.compare", "Comparison"),
           "launch": ("npusim.results.launch", "launch"), "Limits": ("npusim.results.launch", "Limits"),
           "functional": ("npusim.functional", None)}

__all__ = sorted([*_PUBLIC, "__version__"])


def _version() -> str:
    """The installed version, read on first use of npusim.__version__ (importlib.metadata costs ~15 ms, and every
    CLI start imports npusim)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("npusim")
    except PackageNotFoundError:  # running from a source tree without installation
        return "0.0.0+src"


def __getattr__(name):
    if name == "__version__":
        globals()["__version__"] = found = _version()
        return found
    if name in _PUBLIC:
        import importlib
        module, attr = _PUBLIC[name]
        loaded = importlib.import_module(module)
        return loaded if attr is None else getattr(loaded, attr)
    raise AttributeError(f"module 'npusim' has no attribute '{name}'")


def __dir__():
    return __all__
