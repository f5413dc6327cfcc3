"""Service calls to MoveIt Servo that may never be answered.

A Servo killed outright answers nothing, yet its endpoints linger in discovery
(servo_presence.py), so a client still finds its service ready and an asynchronous call waits
forever; a respawned Servo drops the calls it gets before it has discovered the caller (2-3.5 s
after a SIGKILL with Fast DDS on one machine, measured). Each kind of call to Servo therefore
goes through one `CallSlot`, which bounds how long a call is waited for:

  retry    (idempotent calls: select the command type, read a parameter) while no answer came,
           the call is sent again every `retry_s`; the earlier ones stay pending, since any
           answer will do, up to `max_pending` (the oldest is given up beyond that);
  expire   (`max_pending` 1: pause and resume, whose answers must not arrive out of order) one
           call at a time; one unanswered after `retry_s` is given up (`expire`), its answer
           ignored should it ever come, and the caller treats the state it would have
           confirmed as unknown.

A given-up call is removed from the client (`remove_pending_request`), so a late answer runs
no callback; an answer the client had already taken when its call was given up is ignored
when its callback comes (a Servo gone or respawned meanwhile: its old answers must not
overwrite the new instance's). Thread-safe: the timer, the worker and the executor all reach
it.
"""
from __future__ import annotations

import threading

from vla_spec_ros.ros.late_callbacks import tolerating_destroyed


class CallSlot:
    """The calls of one kind to one service (see the module docstring)."""

    def __init__(self, client, retry_s: float, *, max_pending: int = 1):
        if max_pending < 1:
            raise ValueError(f'max_pending: {max_pending} < 1')
        self.client = client
        self.retry_s = float(retry_s)
        self.max_pending = int(max_pending)
        self._lock = threading.Lock()
        self._pending = []          # (future, sent time), oldest first

    @property
    def is_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def send(self, request, on_answer, now: float) -> bool:
        """Call the service unless a call is pending (for a retry slot: unless the newest is
        younger than `retry_s`), checked and recorded at once so two threads never both
        send; `on_answer(future)` runs once the answer (or the failure) is in, unless the
        call was given up first. Whether it was sent (`now`: time.monotonic)."""
        with self._lock:
            if self._pending and not (self.max_pending > 1
                                      and now - self._pending[-1][1] >= self.retry_s):
                return False
            dropped = self._pending[:max(0, len(self._pending) + 1 - self.max_pending)]
            del self._pending[:len(dropped)]
            # Under the lock, so the call is pending before another thread looks; its answer
            # is handed to the executor as a task, never run inside call_async.
            future = self.client.call_async(request)
            self._pending.append((future, now))
        for old, _ in dropped:
            self.client.remove_pending_request(old)
        future.add_done_callback(tolerating_destroyed(
            lambda done: self._answered(done, on_answer)))
        return True

    def _answered(self, future, on_answer) -> None:
        # A call given up after the client took its answer still gets here (removing the
        # request stops only answers not yet in): its answer is ignored, as promised.
        with self._lock:
            was_pending = any(f is future for f, _ in self._pending)
            self._pending = [(f, t) for f, t in self._pending if f is not future]
        if was_pending:
            on_answer(future)

    def expire(self, now: float) -> bool:
        """Give up the calls unanswered for `retry_s`; whether any was."""
        with self._lock:
            old = [f for f, t in self._pending if now - t >= self.retry_s]
            self._pending = [(f, t) for f, t in self._pending if now - t < self.retry_s]
        for future in old:
            self.client.remove_pending_request(future)
        return bool(old)

    def clear(self) -> None:
        """Give up every pending call (one answer was enough, or Servo went away)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future, _ in pending:
            self.client.remove_pending_request(future)


__all__ = ['CallSlot']
