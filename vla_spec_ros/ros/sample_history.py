"""The recent samples of one input key (a joint's positions, a state vector), kept by time.

A state is paired with an image by time: the sample closest to the image's time, which may be
up to `max_action_age` old when it is answered, within `max_state_age` of it. So what is kept
is decided by time, not count: every sample of the last `keep_s` seconds (the node clock),
whatever the publisher's rate (a 1 kHz broadcaster keeps a thousand a second; a fixed count
of 256 kept only a quarter of a second of it, and a late image set found no state although it
had been received). A hard cap bounds memory against a flood. Samples are kept sorted by time
(a publisher's stamps may step back), so the closest one is found by bisection.
"""
from __future__ import annotations

import bisect

MAX_SAMPLES = 10000     # per key: 10 s of a 1 kHz topic


class SampleHistory:
    """Samples (time_s, value, error) of one key; not thread-safe (the caller locks)."""

    def __init__(self, max_samples: int = MAX_SAMPLES):
        self.max_samples = max_samples
        self._times: list[float] = []
        self._samples: list[tuple] = []
        self.last_received: tuple | None = None     # whatever its time

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: tuple, now_s: float, keep_s: float) -> None:
        """Keep `sample` (time_s first); drop what is older than `keep_s` before `now_s`, and
        the oldest beyond the cap, but never the newest one (a stale state is reported as
        stale, with how far it is, not as never received)."""
        time_s = sample[0]
        index = bisect.bisect_right(self._times, time_s)
        self._times.insert(index, time_s)
        self._samples.insert(index, sample)
        self.last_received = sample
        drop = bisect.bisect_left(self._times, now_s - keep_s)
        drop = min(max(drop, len(self._times) - self.max_samples), len(self._times) - 1)
        if drop > 0:
            del self._times[:drop]
            del self._samples[:drop]

    def nearest(self, time_s: float) -> tuple | None:
        """The sample whose time is closest to `time_s` (the later one on a tie), or None."""
        index = bisect.bisect_left(self._times, time_s)
        candidates = [i for i in (index - 1, index) if 0 <= i < len(self._times)]
        if not candidates:
            return None
        best = min(candidates, key=lambda i: (abs(self._times[i] - time_s), -i))
        return self._samples[best]


__all__ = ['MAX_SAMPLES', 'SampleHistory']
