"""Runtime counters of the node and their /diagnostics message.

`InferenceStats` is thread-safe plain Python (the worker thread and the executor both write
it) and is unit-tested without rclpy. `diagnostic_status` turns a snapshot into a
diagnostic_msgs/DiagnosticStatus (the layout diagnostic_updater would publish: name, level,
message, hardware_id, key/value pairs), imported lazily.
"""
from __future__ import annotations

import math
import threading
from collections import deque

from vla_spec_ros.ros.command import FAILURE_REASONS, reason_kind
from vla_spec_ros.validation import check_number

OK, WARN, ERROR = 0, 1, 2          # diagnostic_msgs/DiagnosticStatus levels


def percentile(values, q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sequence."""
    if not values:
        raise ValueError('values: empty')
    if not 0.0 <= q <= 100.0:
        raise ValueError('q: must be in [0, 100]')
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


# Where a frame's time goes on the node, in order (seconds each; they sum to its latency):
#   queue    receipt (executor callback) -> the worker takes it (the worker was stepping)
#   convert  image message -> RGB array, Frame built
#   wait     submitted -> admitted by the engine (earlier frames in flight, a full pipeline)
#   steps    admitted -> its action decided (the packed steps it rode in, vision included)
#   publish  decided -> its twist published (emitted after earlier frames, safety check)
FRAME_STAGES = ('queue', 'convert', 'wait', 'steps', 'publish')


def frame_stages(receipt_s: float, taken_s: float, converted_s: float, engine_latency_s: float,
                 engine_compute_s: float, published_s: float) -> dict:
    """FRAME_STAGES of one frame from its node timestamps (one monotonic clock) and the
    engine's own durations (submit -> decided, admitted -> decided)."""
    wait = max(0.0, engine_latency_s - engine_compute_s)
    return {'queue': taken_s - receipt_s, 'convert': converted_s - taken_s, 'wait': wait,
            'steps': engine_compute_s,
            'publish': max(0.0, published_s - converted_s - engine_latency_s)}


class InferenceStats:
    """Counts frames, drops, stale results and holds; windows latency / rate / acceptance."""

    def __init__(self, window_s: float = 10.0, max_samples: int = 1000):
        check_number('window_s', window_s, above=0.0)
        self._lock = threading.Lock()
        self._window_s = window_s
        self._publish_times: deque = deque(maxlen=max_samples)   # monotonic seconds
        self._latencies: deque = deque(maxlen=max_samples)       # seconds
        self._accepted: deque = deque(maxlen=max_samples)        # tokens per verify step
        # Where each published frame's time went (FRAME_STAGES, seconds), one dict per frame.
        self._stages: deque = deque(maxlen=max_samples)
        self.num_frames_received = 0
        self.num_frames_dropped = 0
        self.num_frames_stale = 0
        self.num_frames_submitted = 0
        self.num_actions_published = 0
        self.num_holds = 0
        self.num_errors = 0
        self.num_verify_steps = 0          # over the node's lifetime (the window forgets)
        self.num_accepted_tokens = 0
        self.hold_reason: str | None = None
        self.last_error = ''

    def record_received(self) -> None:
        with self._lock:
            self.num_frames_received += 1

    def record_dropped(self, count: int = 1) -> None:
        with self._lock:
            self.num_frames_dropped += count

    def record_submitted(self) -> None:
        with self._lock:
            self.num_frames_submitted += 1

    def record_action(self, now_s: float, latency_s: float, accepted_lengths=(),
                      stages: dict | None = None) -> None:
        """One published action: its receipt -> publish latency, the tokens each verifier
        forward decided, and (optional) the seconds it spent in each of FRAME_STAGES."""
        with self._lock:
            self.num_actions_published += 1
            self._publish_times.append(now_s)
            self._latencies.append(latency_s)
            if stages is not None:
                self._stages.append(stages)
            self._accepted.extend(float(a) for a in accepted_lengths)
            self.num_verify_steps += len(accepted_lengths)
            self.num_accepted_tokens += int(sum(accepted_lengths))
            self.hold_reason = None

    def record_hold(self, reason: str, *, is_stale_result: bool = False) -> None:
        with self._lock:
            self.num_holds += 1
            self.hold_reason = reason
            if is_stale_result:
                self.num_frames_stale += 1
            if reason_kind(reason) in FAILURE_REASONS:
                self.num_errors += 1
                self.last_error = reason

    def set_hold_reason(self, reason: str | None) -> None:
        with self._lock:
            self.hold_reason = reason

    def snapshot(self, now_s: float) -> dict:
        """Counters plus windowed rates; latencies in ms. Window = the last `window_s`."""
        with self._lock:
            recent = [t for t in self._publish_times if now_s - t <= self._window_s]
            latencies = list(self._latencies)
            accepted = list(self._accepted)
            stages = list(self._stages)
            snap = {
                'frames_received': self.num_frames_received,
                'frames_submitted': self.num_frames_submitted,
                'frames_dropped': self.num_frames_dropped,
                'frames_stale': self.num_frames_stale,
                'actions_published': self.num_actions_published,
                'holds': self.num_holds,
                'errors': self.num_errors,
                'verify_steps': self.num_verify_steps,
                'accepted_tokens': self.num_accepted_tokens,
                'hold_reason': self.hold_reason or '',
                'last_error': self.last_error,
            }
        # Rate over the span the window's publications cover (count - 1 intervals).
        if len(recent) >= 2 and recent[-1] > recent[0]:
            snap['action_rate_hz'] = (len(recent) - 1) / (recent[-1] - recent[0])
        else:
            snap['action_rate_hz'] = 0.0
        snap['latency_p50_ms'] = 1e3 * percentile(latencies, 50) if latencies else float('nan')
        snap['latency_p99_ms'] = 1e3 * percentile(latencies, 99) if latencies else float('nan')
        snap['acceptance_length'] = sum(accepted) / len(accepted) if accepted else float('nan')
        for stage in FRAME_STAGES:
            values = [s[stage] for s in stages if stage in s]
            for q in (50, 99):
                snap[f'{stage}_p{q}_ms'] = 1e3 * percentile(values, q) if values \
                    else float('nan')
        return snap


def level_for(snapshot: dict) -> int:
    kind = reason_kind(snapshot['hold_reason'] or None)
    if kind is None:
        return OK
    return ERROR if kind in FAILURE_REASONS else WARN


def diagnostic_status(snapshot: dict, *, name: str, hardware_id: str, mode: str,
                      is_enabled: bool):
    """Snapshot -> diagnostic_msgs/DiagnosticStatus."""
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

    status = DiagnosticStatus()
    status.level = bytes([level_for(snapshot)])
    status.name = name
    status.hardware_id = hardware_id
    status.message = snapshot['hold_reason'] or 'publishing actions'
    values = dict(snapshot, mode=mode, enabled=is_enabled)
    status.values = [KeyValue(key=k, value=_format(v)) for k, v in values.items()]
    return status


def _format(value) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.3f}'
    return str(value).lower() if isinstance(value, bool) else str(value)


__all__ = ['InferenceStats', 'FRAME_STAGES', 'frame_stages', 'percentile', 'level_for',
           'diagnostic_status', 'OK', 'WARN', 'ERROR']
