"""Which of one robot's hold and refusal reasons go to the log, and when (pure Python).

Every reason a robot holds or refuses for goes to /diagnostics; the log gets a line per reason
without drowning in repeats. rclpy's own `throttle_duration_sec` cannot do this: it throttles
per call site, so one line of code logging every robot's holds lets one robot's "chunk ran out"
hide another robot's next reason, and a robot's own reason that changes within the throttle.

The rule, per robot (one HoldLog each):

  - a reason is logged at once unless the same reason was logged less than `throttle_s` ago;
  - "the same" ignores the numbers in it (ages, stamps, counts: `reason_key`), so a stale
    image whose age grows each tick is one reason, while a stale wrist camera and a stale
    base camera, or a stale image and an out-of-sync pair, are two;
  - a logged repeat says how many times the reason came since it was last logged.

So each robot logs at most one line per distinct reason every `throttle_s`, and a new reason
(another robot's, or its own next one) is never hidden by an earlier one.
"""
from __future__ import annotations

import re
import threading
import time

THROTTLE_S = 2.0           # a repeat of one robot's reason is logged at most this often
MAX_REASONS = 64           # reasons remembered per robot before the old ones are forgotten

_NUMBER = re.compile(r'[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')


def reason_key(reason: str) -> str:
    """The reason with its numbers masked: what makes two reasons "the same"."""
    return _NUMBER.sub('#', reason)


class HoldLog:
    """`admit(reason)` says whether and what to log for one robot (module docstring);
    thread-safe (the worker, the chunk clock and the executor all report holds)."""

    def __init__(self, throttle_s: float = THROTTLE_S, clock=time.monotonic):
        self.throttle_s = float(throttle_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._logged: dict[str, tuple[float, int]] = {}     # key -> (logged at, repeats since)

    def admit(self, reason: str, now_s: float | None = None) -> str | None:
        """The text to log for `reason` now, or None when it is a repeat to hold back."""
        now_s = self._clock() if now_s is None else now_s
        key = reason_key(reason)
        with self._lock:
            logged_s, num_repeats = self._logged.get(key, (None, 0))
            if logged_s is not None and now_s - logged_s < self.throttle_s:
                self._logged[key] = (logged_s, num_repeats + 1)
                return None
            self._forget_old(now_s)
            self._logged[key] = (now_s, 0)
        if num_repeats:
            return f'{reason} ({num_repeats} more since it was last logged)'
        return reason

    def _forget_old(self, now_s: float) -> None:
        """Bound the memory: past MAX_REASONS, reasons outside the throttle window go (their
        next occurrence is logged, as it would be anyway)."""
        if len(self._logged) < MAX_REASONS:
            return
        self._logged = {key: value for key, value in self._logged.items()
                        if now_s - value[0] < self.throttle_s}


__all__ = ['HoldLog', 'reason_key', 'THROTTLE_S']
