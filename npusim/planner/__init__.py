"""Capacity planning: search parallel plans that meet a TTFT / TPOT SLO, optionally under a load (npusim plan)."""

from npusim.planner.search import Candidate, SearchResult, Served, Traffic, commands, search, write_plan
from npusim.planner.space import SearchSpace

__all__ = ["Candidate", "SearchResult", "SearchSpace", "Served", "Traffic", "commands", "search", "write_plan"]
