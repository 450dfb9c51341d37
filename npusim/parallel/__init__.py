"""Parallel plans: sharding of the op graph over ranks, and the collectives that the sharding needs."""
