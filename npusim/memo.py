"""The least-recently-used memo the in-process caches share (loaded specs, rank steps, engine layouts, kernel
results): a sweep's worker fills them point after point, so each keeps its last `size` keys."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class Lru(Generic[T]):
    """Values by key, computed on a miss; the `size` keys used last are kept."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[Hashable, T] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value of `key`, from `compute()` on a miss (an exception is raised, not kept)."""
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
        value = entries[key] = compute()
        if len(entries) > self.size:
            entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
