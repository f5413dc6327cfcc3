"""Slot bookkeeping of the unified KV ring buffer (plain Python, no torch).

Follows ActionFlow's unified KV ring: every in-flight request keeps its KV history in one shared
buffer per decoder layer, shape (capacity, num_kv_heads, head_dim), so that one packed
variable-length attention call can serve every request of a step. This module only decides
WHICH slots a request owns; the tensors live in the model runner.

A request owns one span of ``length`` consecutive slots modulo ``capacity``: logical index i
(0 = BOS) lives in physical slot ``(start + i) % capacity``. A span may wrap past the end of
the buffer, so no slot is ever wasted on padding at the end.

Allocation policy ("next fit in ring order"): a new span starts at the first slot, scanning in
ring order from the end of the most recent allocation, at which ``num_slots`` consecutive slots
(modulo capacity) are free. Releases may come in any order (speculative requests finish out of
order); a released span is free at once and merges with the free slots around it, because the
free region is simply every slot outside a live span. With requests that finish in admission
order (plain pipelining) this is the classic FIFO ring: the oldest live span is the head, new
spans are appended at the tail and slots are reused in ring order. Allocation never moves live
spans, so no KV copy (shift) is ever needed to retire a request.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RingSpan:
    """``length`` consecutive slots of a ring of ``capacity`` slots, starting at ``start``."""

    start: int
    length: int
    capacity: int

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f'capacity: must be >= 1, got {self.capacity}')
        if not 0 <= self.start < self.capacity:
            raise ValueError(f'start: must be in [0, {self.capacity}), got {self.start}')
        if not 1 <= self.length <= self.capacity:
            raise ValueError(f'length: must be in [1, {self.capacity}], got {self.length}')

    @property
    def end(self) -> int:
        """Physical slot just after the span (== start when the span fills the ring)."""
        return (self.start + self.length) % self.capacity

    @property
    def is_wrapped(self) -> bool:
        """True when the span runs past the last slot and continues at slot 0."""
        return self.start + self.length > self.capacity

    def slot(self, logical_index: int) -> int:
        """Physical slot of logical index ``logical_index`` (0 <= logical_index < length)."""
        if not 0 <= logical_index < self.length:
            raise ValueError(f'logical_index: must be in [0, {self.length}), '
                             f'got {logical_index}')
        return (self.start + logical_index) % self.capacity

    def slots(self, start: int = 0, count: int | None = None) -> list[int]:
        """Physical slots of logical indices start .. start + count - 1 (default: to the end)."""
        if count is None:
            count = self.length - start
        if start < 0 or count < 0 or start + count > self.length:
            raise ValueError(f'start, count: logical range [{start}, {start + count}) is '
                             f'outside the span of length {self.length}')
        first = self.start + start
        return [(first + i) % self.capacity for i in range(count)]

    def contains(self, slot: int) -> bool:
        """True when physical slot ``slot`` belongs to this span."""
        return 0 <= slot < self.capacity and (slot - self.start) % self.capacity < self.length


class KVRing:
    """Owner map of a ring of ``capacity`` KV slots; one live span per request id."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f'capacity: must be an int >= 1, got {capacity!r}')
        self._capacity = capacity
        self._spans: dict[int, RingSpan] = {}   # request_id -> span, in allocation order
        self._cursor = 0                        # end of the most recent allocation
        self._num_used = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def num_free(self) -> int:
        """Free slots in total (not necessarily contiguous)."""
        return self._capacity - self._num_used

    @property
    def num_live(self) -> int:
        return len(self._spans)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._spans

    def span(self, request_id: int) -> RingSpan:
        try:
            return self._spans[request_id]
        except KeyError:
            raise ValueError(f'request_id: {request_id} owns no span in the ring') from None

    def slot(self, request_id: int, logical_index: int) -> int:
        """Physical slot of the request's logical index ``logical_index``."""
        return self.span(request_id).slot(logical_index)

    def slots(self, request_id: int, start: int, count: int) -> list[int]:
        """Physical slots of the request's logical indices start .. start + count - 1."""
        return self.span(request_id).slots(start, count)

    def allocate(self, request_id: int, num_slots: int) -> RingSpan | None:
        """Reserve ``num_slots`` consecutive slots for ``request_id``; None when there is no room.

        No room is an ordinary outcome (the caller waits for releases); a request larger than
        the whole ring, or an id that already owns a span, is a ValueError.
        """
        self._check_num_slots(num_slots)
        if request_id in self._spans:
            raise ValueError(f'request_id: {request_id} already owns a span')
        start = self._find_start(num_slots)
        if start is None:
            return None
        span = RingSpan(start, num_slots, self._capacity)
        self._spans[request_id] = span
        self._num_used += num_slots
        self._cursor = span.end
        return span

    def release(self, request_id: int) -> RingSpan:
        """Free the request's span (any order); returns the span that was freed."""
        span = self.span(request_id)
        del self._spans[request_id]
        self._num_used -= span.length
        return span

    def _check_num_slots(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f'num_slots: must be an int >= 1, got {num_slots!r}')
        if num_slots > self._capacity:
            raise ValueError(f'num_slots: {num_slots} slots can never fit in a ring of '
                             f'capacity {self._capacity}')

    def _find_start(self, num_slots: int) -> int | None:
        """First start in ring order from the cursor with ``num_slots`` free slots after it."""
        if not self._spans:
            return self._cursor
        capacity = self._capacity
        cursor = self._cursor
        ordered = sorted(self._spans.values(), key=lambda s: s.start)
        best_start, best_distance = None, capacity
        # Free gaps lie between the end of one live span and the start of the next one in
        # physical order (the last gap wraps around to the first span).
        for span, following in zip(ordered, ordered[1:] + ordered[:1]):
            gap_start = span.end
            gap_length = (following.start - gap_start) % capacity
            if gap_length < num_slots:
                continue
            offset = (cursor - gap_start) % capacity   # cursor's offset inside this gap
            if offset < gap_length and gap_length - offset >= num_slots:
                return cursor                          # distance 0: nothing can be earlier
            # Otherwise the gap's first slot is its earliest start in scan order; when the
            # cursor lies inside the gap, that slot is reached last (distance capacity - offset).
            distance = (gap_start - cursor) % capacity
            if distance < best_distance:
                best_start, best_distance = gap_start, distance
        return best_start
