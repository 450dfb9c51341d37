"""Capacity planning: search parallel plans that meet a TTFT / TPOT SLO, size their prefill and decode pools, and
serve them (optionally under a load) beside co-located deployments (npusim plan)."""

from npusim.planner.pools import Pools, size_pools
from npusim.planner.search import Candidate, SearchResult, Served, Traffic, commands, search, write_plan
from npusim.planner.space import SearchSpace

__all__ = ["Candidate", "Pools", "SearchResult", "SearchSpace", "Served", "Traffic", "commands", "search",
           "size_pools", "write_plan"]
