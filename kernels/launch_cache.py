"""One bounded cache for the launch path's host work (block plans, launch plans): least recently
used out first, at most `max_entries` entries and `max_bytes` bytes together, and an entry larger
than `max_item_bytes` is built every time instead of kept (a plan for N = 1M with small blocks
would otherwise pin gigabytes). Host side only; no torch, no Triton.

The most recently used entry is also kept as one (key, value) pair: a call repeating the last key
compares keys instead of hashing them twice (the lookup and the move to the LRU end); that entry
is already the most recently used, so the order is the same."""

from __future__ import annotations

from collections import OrderedDict


class BoundedCache:
    """get / put by a hashable key; sizes come from `size_of(value)` in bytes."""

    def __init__(self, max_entries: int, max_bytes: int, max_item_bytes: int, size_of):
        self.max_entries, self.max_bytes, self.max_item_bytes = max_entries, max_bytes, max_item_bytes
        self._size_of = size_of
        self._items: OrderedDict = OrderedDict()      # key -> (value, bytes)
        self._last = None                             # (key, value) of the most recently used entry
        self.bytes = 0

    def get(self, key):
        """The value kept for key (now the most recently used), or None."""
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        self._last = (key, hit[0])
        return hit[0]

    def put(self, key, value):
        """Keep value unless it is over max_item_bytes; evict the least recently used to fit.
        Returns value."""
        size = int(self._size_of(value))
        self._last = None
        if size > self.max_item_bytes:
            return value
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[key] = (value, size)
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped
        if key in self._items:
            self._last = (key, value)
        return value

    def clear(self) -> None:
        self._last = None
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)
