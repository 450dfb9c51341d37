"""Capacity planning: search parallel plans that meet a TTFT / TPOT SLO (npusim plan)."""

from npusim.planner.search import Candidate, SearchResult, Slo, search, write_plan
from npusim.planner.space import SearchSpace

__all__ = ["Candidate", "SearchResult", "SearchSpace", "Slo", "search", "write_plan"]
