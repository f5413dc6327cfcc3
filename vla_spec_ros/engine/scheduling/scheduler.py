"""What each packed step contains: cross-request pipelining (plain Python, no torch).

Follows ActionFlow's cross-request pipelining: one forward pass carries the prefill of the
next waiting frame together with one decode work item of every frame already in flight, so the
memory-bound single-token decodes ride along with the prefill's large matrix product. With
several streams (robots), up to ``max_prefills`` waiting frames are prefilled in one step: the
step's fixed cost (draft levels, launches, host work) is then shared by several new frames. With
speculation a decode work item is one draft tree instead of one token; the scheduler does not
care which, it only counts the tokens each request gains (S2, S5, S6 in docs/architecture.md).

Life of a request (one camera frame of one stream):
  waiting --(admitted: a prefill slot in a step, span reserved in the KV ring)--> in flight
  in flight --(num_tokens_needed tokens decided; ring span released)--> finished
  finished --(every earlier frame of its stream emitted)--> emitted by ``pop_finished``

Contracts:
- Admission is in queue order over all streams: waiting requests are admitted in
  submission order, except that ``replace_waiting`` puts a stream's newer frame in the place
  of the one it replaces (so request ids need not be increasing along the queue); at
  most ``max_prefills`` per step, and admission stops at the first that cannot be admitted
  (``max_inflight`` reached or no room in the ring); with none admitted the step is
  decode-only. A smaller later request never bypasses it, so a large prompt cannot starve.
  One exception: a stream with ``max_inflight_per_stream`` requests in flight is passed over
  (its waiting requests keep their place; the streams behind it go on). Its own requests
  finish within the S2 bound, so it is passed over for at most that long, and its frames
  stay in order among themselves.
  Liveness: in-flight requests always advance, so the ring eventually empties, and every
  request fits in an empty ring (checked at ``submit``).
- A request admitted at step s gains its first token in step s; with plain decoding it gains
  one token per step and finishes in step s + max_tokens - 1 at the latest (depth D =
  max_tokens steps; a codec's end marker may finish it sooner).
  Speculation gains >= 1 token per step, so it finishes no later; since frames of a stream are
  admitted in order, holding a frame behind its predecessor never delays it past that bound.
- Finished requests are emitted in submission order per stream (S2); across streams in the
  order they became emittable (finishing order, a held frame right after its predecessor).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ...validation import check_int
from .kv_ring import KVRing
from .request import Request


@dataclass(frozen=True)
class ScheduledStep:
    """One packed step: the requests admitted now (their prefills, in queue order) plus the
    in-flight requests that advance."""

    prefills: list[Request]
    decode: list[Request]   # in-flight requests admitted in earlier steps, in admission order

    @property
    def decode_ids(self) -> list[int]:
        return [r.request_id for r in self.decode]

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decode


class Scheduler:
    """Admission, progress and in-order emission of requests over one shared ``KVRing``.

    The scheduler is the ring's only allocator. Per step the strategy calls ``schedule``, runs
    the forward pass, reports ``on_tokens`` for every request of the step, then ``pop_finished``.
    """

    def __init__(self, max_inflight: int, max_tokens: int, ring: KVRing, max_prefills: int = 1,
                 max_inflight_per_stream: int | None = None):
        self.max_inflight = check_int('max_inflight', max_inflight, minimum=1)
        # None: only max_inflight bounds one stream.
        self.max_inflight_per_stream = (
            None if max_inflight_per_stream is None
            else check_int('max_inflight_per_stream', max_inflight_per_stream, minimum=1))
        self.max_prefills = check_int('max_prefills', max_prefills, minimum=1)
        self.max_tokens = check_int('max_tokens', max_tokens, minimum=1)
        self.ring = ring
        self._requests: dict[int, Request] = {}        # every request not yet emitted/dropped
        self._waiting: deque[Request] = deque()
        self._inflight: dict[int, Request] = {}        # in flight, in admission order
        self._finish_order: list[int] = []             # finished, not yet emitted
        self._pending: dict[str, deque[int]] = {}      # per stream: not yet emitted, in order
        self._last_request_id: int | None = None

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    @property
    def waiting_streams(self) -> frozenset:
        """Streams with a request waiting for admission."""
        return frozenset(r.stream_id for r in self._waiting)

    @property
    def active_streams(self) -> tuple[str, ...]:
        """Streams with a request not yet emitted (waiting, in flight or held)."""
        return tuple(self._pending)

    def has_work(self) -> bool:
        """True while a request waits or is in flight (a step would make progress)."""
        return bool(self._waiting or self._inflight)

    def submit(self, request: Request) -> None:
        """Queue ``request`` for admission behind every waiting request."""
        self._check_new(request)
        self._enqueue(request, len(self._waiting))

    def replace_waiting(self, request: Request) -> list[Request]:
        """Queue ``request`` in place of its stream's waiting requests (latest-wins
        replacement) and return them. It takes the queue position of the oldest one it
        replaces: the stream has been waiting since then, and a stream whose camera keeps
        replacing its frame must not fall behind the other streams' frames each time (with
        the camera period near the action time, appending it starved one robot entirely).
        Validation comes first: a refused request replaces nothing."""
        self._check_new(request)
        position = next((i for i, r in enumerate(self._waiting)
                         if r.stream_id == request.stream_id), len(self._waiting))
        replaced = self.drop_waiting(request.stream_id)
        self._enqueue(request, position)
        return replaced

    def _check_new(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise ValueError(f'request: must be a Request, got {type(request).__name__}')
        if request.tokens:
            raise ValueError(f'request: {request.request_id} already has tokens')
        if self._last_request_id is not None and request.request_id <= self._last_request_id:
            raise ValueError(f'request_id: {request.request_id} must exceed the last submitted '
                             f'id {self._last_request_id}')
        if request.num_tokens_needed != self.max_tokens:
            raise ValueError(f'num_tokens_needed: {request.num_tokens_needed} != max_tokens '
                             f'{self.max_tokens}')
        if request.num_slots > self.ring.capacity:
            raise ValueError(f'num_slots: request {request.request_id} needs {request.num_slots} '
                             f'slots (prefix_len {request.prefix_len}) but the KV ring holds '
                             f'only {self.ring.capacity}')

    def _enqueue(self, request: Request, position: int) -> None:
        self._last_request_id = request.request_id
        self._requests[request.request_id] = request
        self._waiting.insert(position, request)
        self._pending.setdefault(request.stream_id, deque()).append(request.request_id)

    def schedule(self) -> ScheduledStep:
        """Decide the next packed step (empty when there is no work)."""
        # 1. Every request already in flight advances (S6: also when nothing waits).
        decode = list(self._inflight.values())
        # 2. The oldest waiting requests are prefilled while the pipeline and the ring have
        #    room, at most max_prefills of them; a stream at its own cap is passed over.
        prefills = []
        per_stream = self._inflight_per_stream()
        index = 0
        while (index < len(self._waiting) and len(prefills) < self.max_prefills
               and len(self._inflight) < self.max_inflight):
            head = self._waiting[index]
            if (self.max_inflight_per_stream is not None
                    and per_stream.get(head.stream_id, 0) >= self.max_inflight_per_stream):
                index += 1
                continue
            if self.ring.allocate(head.request_id, head.num_slots) is None:
                if not self._inflight:
                    raise RuntimeError(f'request {head.request_id} needs {head.num_slots} '
                                       f'slots but the ring has {self.ring.num_free} free with '
                                       'nothing in flight: the ring is allocated outside the '
                                       'scheduler')
                break
            del self._waiting[index]
            prefills.append(head)
            self._inflight[head.request_id] = head
            per_stream[head.stream_id] = per_stream.get(head.stream_id, 0) + 1
        return ScheduledStep(prefills=prefills, decode=decode)

    def _inflight_per_stream(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for request in self._inflight.values():
            counts[request.stream_id] = counts.get(request.stream_id, 0) + 1
        return counts

    def on_tokens(self, request_id: int, tokens: Sequence[int], is_final: bool = False) -> bool:
        """Append newly decided ``tokens`` to the request; True when it just finished: it has
        ``num_tokens_needed`` tokens, or ``is_final`` (its codec's end marker came first).

        A finished request's ring span is released at once; its KV is no longer read.
        """
        request = self._check_inflight(request_id)
        if isinstance(tokens, (str, bytes)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ValueError(f'tokens: must be a sequence of ints, got {tokens!r}')
        num_tokens = request.num_tokens + len(tokens)
        if num_tokens > request.num_tokens_needed:
            raise ValueError(f'tokens: {len(tokens)} tokens for request {request_id} would give '
                             f'{num_tokens} of {request.num_tokens_needed} (truncate to '
                             'num_remaining)')
        request.tokens.extend(tokens)
        if num_tokens < request.num_tokens_needed and not is_final:
            return False
        del self._inflight[request_id]
        self.ring.release(request_id)
        self._finish_order.append(request_id)
        return True

    def pop_finished(self) -> list[Request]:
        """Ids ready to emit: per stream in submission order, across streams as they finish.

        A frame becomes emittable when it and every earlier frame of its stream have finished;
        frames are returned in the order they became emittable (replaying finish events), so a
        held frame comes right after the predecessor that releases it.
        """
        replayed: set[int] = set()
        emitted: list[Request] = []
        for request_id in self._finish_order:
            replayed.add(request_id)
            stream_id = self._requests[request_id].stream_id
            pending = self._pending[stream_id]
            while pending and pending[0] in replayed:
                ready = pending.popleft()
                emitted.append(self._requests.pop(ready))
            if not pending:
                del self._pending[stream_id]
        self._finish_order = [i for i in self._finish_order if i in self._requests]
        return emitted

    def drop_waiting(self, stream_id: str) -> list[Request]:
        """Drop the stream's requests not yet prefilled (latest-wins replacement)."""
        dropped = [r.request_id for r in self._waiting if r.stream_id == stream_id]
        self._waiting = deque(r for r in self._waiting if r.stream_id != stream_id)
        return self._forget(dropped)

    def reset(self, stream_id: str | None = None) -> list[Request]:
        """Drop every unemitted request (waiting, in flight, finished but held) of one stream,
        or of all streams when ``stream_id`` is None; frees their ring slots; returns them in
        submission order."""
        dropped = sorted(i for i, r in self._requests.items()
                         if stream_id is None or r.stream_id == stream_id)
        dropped_set = set(dropped)
        self._waiting = deque(r for r in self._waiting if r.request_id not in dropped_set)
        for request_id in dropped:
            if request_id in self._inflight:
                del self._inflight[request_id]
                self.ring.release(request_id)
        self._finish_order = [i for i in self._finish_order if i not in dropped_set]
        return self._forget(dropped)

    def _forget(self, request_ids: list[int]) -> list[Request]:
        forgotten = []
        for request_id in request_ids:
            request = self._requests.pop(request_id)
            forgotten.append(request)
            pending = self._pending[request.stream_id]
            pending.remove(request_id)
            if not pending:
                del self._pending[request.stream_id]
        return forgotten

    def _check_inflight(self, request_id: int) -> Request:
        try:
            return self._inflight[request_id]
        except KeyError:
            raise ValueError(f'request_id: {request_id} is not in flight') from None
