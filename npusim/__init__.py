"""npusim: performance simulator and cost model of Huawei Ascend NPUs running sparse-attention LLMs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npusim")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+src"
