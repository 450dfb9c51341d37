"""npusim: performance simulator and cost model of Huawei Ascend NPUs running sparse-attention LLMs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npusim")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+src"

# The public API, imported on first use so that `import npusim` (and every CLI start) stays light.
_PUBLIC = {"predict": ("npusim.api", "predict"), "sweep": ("npusim.sweeps", "sweep"),
           "plan": ("npusim.planner", "search"), "Slo": ("npusim.serving", "Slo"),
           "cost": ("npusim.results.cost", "cost"), "CostParams": ("npusim.results.cost", "CostParams"),
           "check": ("npusim.checks", "check"), "compare": ("npusim.results.compare", "compare")}


def __getattr__(name):
    if name in _PUBLIC:
        import importlib
        module, attr = _PUBLIC[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'npusim' has no attribute '{name}'")

