"""Regression checks against recorded baselines, and predictions against measured results (npusim check)."""

from npusim.checks.baseline import Baseline, Comparison, check
from npusim.checks.measured import compare, load_measured

__all__ = ["Baseline", "Comparison", "check", "compare", "load_measured"]
