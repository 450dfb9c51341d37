"""Layer 2: model + phase + scenario -> op graph (ops with shapes, dtypes, FLOPs, bytes) and model accounting."""

from npusim.graph.builder import PHASES, build_graph
from npusim.graph.ops import LayerGraph, ModelGraph, Op

__all__ = ["PHASES", "LayerGraph", "ModelGraph", "Op", "build_graph"]
