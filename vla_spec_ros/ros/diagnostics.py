"""Runtime counters of the node and their /diagnostics message.

`InferenceStats` is thread-safe plain Python (the worker thread and the executor both write
it) and is unit-tested without rclpy. `diagnostic_status` turns a snapshot into a
diagnostic_msgs/DiagnosticStatus (the layout diagnostic_updater would publish: name, level,
message, hardware_id, key/value pairs), imported lazily.

Overload. A robot's frames that the engine never acts on are counted where they are dropped:
replaced in the robot's one-frame slot before the worker took them, or replaced while waiting
for admission (latest wins). Over the window each robot reports `answered_fraction` (actions
published / frames received), `dropped_fraction` and `action_age_max_ms` (the oldest image an
action was published for: never above `max_action_age`; for a chunked model, the image age when
its chunk arrived, which may reach the chunk limit, docs/chunks.md). `engine_summary` adds them
up over the node's robots: the engine is `saturated` when more than SATURATION_DROPPED_FRACTION
of the frames received in the window were dropped because it was busy; its status is then WARN
with that number in the message (`engine_status`).
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque

from vla_spec_ros.ros.command_rules import FAILURE_REASONS, reason_kind
from vla_spec_ros.validation import check_number

OK, WARN, ERROR = 0, 1, 2          # diagnostic_msgs/DiagnosticStatus levels
# The engine is saturated when more than this fraction of the frames received in the window
# were dropped unanswered because it was busy with earlier ones.
SATURATION_DROPPED_FRACTION = 0.1
_MAX_WINDOW_EVENTS = 100_000       # bound on the per-window event queues (any camera rate)


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
        # (monotonic time, value) of the last `max_samples` published actions, read over the
        # last `window_s` only (a robot that held for an hour shows no latency, not the last
        # one it had): receipt -> publish latency (s), tokens per verify step, and where each
        # published frame's time went (FRAME_STAGES, seconds, one dict per frame).
        self._latencies: deque = deque(maxlen=max_samples)
        self._accepted: deque = deque(maxlen=max_samples)
        self._stages: deque = deque(maxlen=max_samples)
        # Monotonic seconds of each received and each dropped frame, and (time, image age) of
        # each published action, over the last `window_s` (pruned as they are appended).
        self._received_times: deque = deque(maxlen=_MAX_WINDOW_EVENTS)
        self._dropped_times: deque = deque(maxlen=_MAX_WINDOW_EVENTS)
        self._action_ages: deque = deque(maxlen=_MAX_WINDOW_EVENTS)
        self.num_frames_received = 0
        self.num_frames_dropped = 0
        self.num_frames_out_of_order = 0
        self.num_frames_stale = 0
        self.num_frames_submitted = 0
        self.num_actions_published = 0
        self.num_holds = 0
        self.num_errors = 0
        self.num_verify_steps = 0          # over the node's lifetime (the window forgets)
        self.num_accepted_tokens = 0
        # Chunked models (docs/chunks.md): steps published on the control clock, steps whose
        # slot passed unpublished, chunks that arrived while the previous one still had steps,
        # zero twists because the newest chunk ran out; chunks that did not decode while a
        # kept chunk went on (invalid_chunk: continue); how late after its slot's start each
        # step went out (seconds).
        self.num_chunk_steps_published = 0
        self.num_chunk_steps_skipped = 0
        self.num_chunks_replaced = 0
        self.num_chunk_run_outs = 0
        self.num_chunks_refused = 0
        self._step_lateness: deque = deque(maxlen=max_samples)   # (time, seconds late)
        # Jumps back of the node clock this robot recovered from (clock_jumps.py).
        self.num_clock_jumps = 0
        self.hold_reason: str | None = None
        self.last_error = ''

    @property
    def window_s(self) -> float:
        return self._window_s

    def _push(self, events: deque, now_s: float, item) -> None:
        events.append(item)
        while events and now_s - _event_time(events[0]) > self._window_s:
            events.popleft()

    def record_received(self, now_s: float | None = None) -> None:
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            self.num_frames_received += 1
            self._push(self._received_times, now_s, now_s)

    def record_dropped(self, count: int = 1, now_s: float | None = None) -> None:
        """`count` frames dropped unanswered (replaced by a newer frame of the robot)."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            self.num_frames_dropped += count
            for _ in range(count):
                self._push(self._dropped_times, now_s, now_s)

    def record_out_of_order(self) -> None:
        """A frame dropped on arrival for a stamp not newer than the previous one: not a
        frame the engine had no time for, so not in the dropped window either."""
        with self._lock:
            self.num_frames_out_of_order += 1

    def record_submitted(self) -> None:
        with self._lock:
            self.num_frames_submitted += 1

    def record_action(self, now_s: float, latency_s: float, accepted_lengths=(),
                      stages: dict | None = None, age_s: float | None = None) -> None:
        """One published action: its receipt -> publish latency, the tokens each verifier
        forward decided, (optional) the seconds it spent in each of FRAME_STAGES and the age
        of its image when it was published (the age `max_action_age` bounds)."""
        with self._lock:
            self.num_actions_published += 1
            self._publish_times.append(now_s)
            if age_s is not None:
                self._push(self._action_ages, now_s, (now_s, age_s))
            self._latencies.append((now_s, latency_s))
            if stages is not None:
                self._stages.append((now_s, stages))
            self._accepted.extend((now_s, float(a)) for a in accepted_lengths)
            self.num_verify_steps += len(accepted_lengths)
            self.num_accepted_tokens += int(sum(accepted_lengths))
            self.hold_reason = None

    def record_chunk(self, *, replaced: bool) -> None:
        """A chunk was accepted; `replaced`: the previous one still had steps left."""
        with self._lock:
            self.num_chunks_replaced += int(replaced)

    def record_chunk_step(self, *, published: bool, num_skipped: int,
                          lateness_s: float | None = None) -> None:
        """A chunk step was decided (`published`, or held by the safety decision) after
        `num_skipped` steps whose slots passed; `lateness_s`: publish time - slot start. A
        published step ends a hold (the robot moves again: no reason stands), as an action
        does."""
        with self._lock:
            self.num_chunk_steps_published += int(published)
            self.num_chunk_steps_skipped += num_skipped
            if published:
                self.hold_reason = None
                if lateness_s is not None:
                    self._step_lateness.append((time.monotonic(), lateness_s))

    def record_chunk_run_out(self, num_skipped: int = 0) -> None:
        """The newest chunk ran out (a zero twist follows, recorded by record_hold)."""
        with self._lock:
            self.num_chunk_run_outs += 1
            self.num_chunk_steps_skipped += num_skipped

    def record_chunk_refused(self, reason: str) -> None:
        """A chunk that did not decode was refused while a kept chunk goes on (no hold):
        counted as an error, `reason` kept as the last one."""
        with self._lock:
            self.num_chunks_refused += 1
            self.num_errors += 1
            self.last_error = reason

    def record_hold(self, reason: str, *, is_stale_result: bool = False) -> None:
        with self._lock:
            self.num_holds += 1
            self.hold_reason = reason
            if is_stale_result:
                self.num_frames_stale += 1
            if reason_kind(reason) in FAILURE_REASONS:
                self.num_errors += 1
                self.last_error = reason

    def record_clock_jump(self) -> None:
        with self._lock:
            self.num_clock_jumps += 1

    def set_hold_reason(self, reason: str | None) -> None:
        with self._lock:
            self.hold_reason = reason

    def snapshot(self, now_s: float) -> dict:
        """Counters plus windowed rates; latencies in ms. Window = the last `window_s`."""
        def windowed(samples):
            return [value for t, value in samples if now_s - t <= self._window_s]
        with self._lock:
            recent = [t for t in self._publish_times if now_s - t <= self._window_s]
            latencies = windowed(self._latencies)
            accepted = windowed(self._accepted)
            stages = windowed(self._stages)
            in_window = [sum(1 for t in events if now_s - t <= self._window_s)
                         for events in (self._received_times, self._dropped_times)]
            ages = [age for t, age in self._action_ages if now_s - t <= self._window_s]
            lateness = windowed(self._step_lateness)
            snap = {
                'frames_received': self.num_frames_received,
                'frames_submitted': self.num_frames_submitted,
                'frames_dropped': self.num_frames_dropped,
                'frames_out_of_order': self.num_frames_out_of_order,
                'frames_stale': self.num_frames_stale,
                'actions_published': self.num_actions_published,
                'holds': self.num_holds,
                'errors': self.num_errors,
                'verify_steps': self.num_verify_steps,
                'accepted_tokens': self.num_accepted_tokens,
                'chunk_steps_published': self.num_chunk_steps_published,
                'chunk_steps_skipped': self.num_chunk_steps_skipped,
                'chunks_replaced': self.num_chunks_replaced,
                'chunk_run_outs': self.num_chunk_run_outs,
                'chunks_refused': self.num_chunks_refused,
                'clock_jumps': self.num_clock_jumps,
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
        snap.update(_window_counts(in_window[0], len(recent), in_window[1]))
        snap['action_age_max_ms'] = 1e3 * max(ages) if ages else float('nan')
        for q in (50, 99):
            snap[f'step_late_p{q}_ms'] = 1e3 * percentile(lateness, q) if lateness \
                else float('nan')
        for stage in FRAME_STAGES:
            values = [s[stage] for s in stages if stage in s]
            for q in (50, 99):
                snap[f'{stage}_p{q}_ms'] = 1e3 * percentile(values, q) if values \
                    else float('nan')
        return snap


def _event_time(item) -> float:
    return item[0] if isinstance(item, tuple) else item


def _window_counts(received: int, actions: int, dropped: int) -> dict:
    """Window counts and the fractions of the frames received that were answered / dropped."""
    return {'frames_in_window': received, 'actions_in_window': actions,
            'dropped_in_window': dropped,
            'answered_fraction': actions / received if received else float('nan'),
            'dropped_fraction': dropped / received if received else float('nan')}


def engine_summary(snapshots: dict, window_s: float) -> dict:
    """The node's engine over its robots' snapshots ({robot: snapshot}): window totals,
    the answered fraction of the least-answered robot, and whether it is saturated."""
    totals = _window_counts(*(sum(s[key] for s in snapshots.values()) for key in
                              ('frames_in_window', 'actions_in_window', 'dropped_in_window')))
    answered = {robot: s['answered_fraction'] for robot, s in snapshots.items()
                if not math.isnan(s['answered_fraction'])}
    worst = min(answered, key=answered.get) if answered else ''
    dropped = totals['dropped_fraction']
    ages = [s['action_age_max_ms'] for s in snapshots.values()
            if not math.isnan(s['action_age_max_ms'])]
    return dict(totals, robots=len(snapshots), window_s=window_s,
                saturated=not math.isnan(dropped) and dropped > SATURATION_DROPPED_FRACTION,
                least_answered_robot=worst,
                least_answered_fraction=answered[worst] if worst else float('nan'),
                action_age_max_ms=max(ages) if ages else float('nan'))


def engine_status(summary: dict, *, name: str, hardware_id: str):
    """engine_summary -> diagnostic_msgs/DiagnosticStatus: WARN while saturated."""
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

    status = DiagnosticStatus()
    status.name = name
    status.hardware_id = hardware_id
    if summary['saturated']:
        status.level = bytes([WARN])
        status.message = (
            f'saturated: {summary["dropped_fraction"]:.0%} of the frames of the last '
            f'{summary["window_s"]:.0f} s dropped while the engine was busy; answered '
            f'{summary["answered_fraction"]:.0%} (least: {summary["least_answered_robot"] or "-"}'
            f' {summary["least_answered_fraction"]:.0%})')
    else:
        status.level = bytes([OK])
        status.message = 'keeping up' if summary['frames_in_window'] else 'no frames'
    status.values = [KeyValue(key=k, value=_format(v)) for k, v in summary.items()]
    return status


def level_for(snapshot: dict) -> int:
    kind = reason_kind(snapshot['hold_reason'] or None)
    if kind is None:
        return OK
    return ERROR if kind in FAILURE_REASONS else WARN


def diagnostic_status(snapshot: dict, *, name: str, hardware_id: str, mode: str,
                      is_enabled: bool, is_acting: bool):
    """Snapshot -> diagnostic_msgs/DiagnosticStatus. `is_enabled`: the robot's `enabled`
    switch, as `ros2 param get` says it; `is_acting`: enabled and the node active (a managed
    node inactive keeps the switch and does not act)."""
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

    status = DiagnosticStatus()
    status.level = bytes([level_for(snapshot)])
    status.name = name
    status.hardware_id = hardware_id
    status.message = snapshot['hold_reason'] or 'publishing actions'
    values = dict(snapshot, mode=mode, enabled=is_enabled, acting=is_acting)
    status.values = [KeyValue(key=k, value=_format(v)) for k, v in values.items()]
    return status


def _format(value) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.3f}'
    return str(value).lower() if isinstance(value, bool) else str(value)


__all__ = ['InferenceStats', 'FRAME_STAGES', 'frame_stages', 'percentile', 'level_for',
           'diagnostic_status', 'engine_summary', 'engine_status',
           'SATURATION_DROPPED_FRACTION', 'OK', 'WARN', 'ERROR']
