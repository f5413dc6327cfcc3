"""Real time: the bridge steps the simulator on its own clock with the newest command that is due
(pure Python: no rclpy, no torch).

Real time (`RealtimeCommand`): every control period the newest twist that is due is used
when it was received less than `command_timeout_s` ago, else zero motion; the gripper holds
its last value (a servo controller's incoming-command timeout). Due: stamped no later than
the state being stepped (its frame's stamp) + half a control period (`due_stamp_ns`). The node
publishes a chunk's step i + 1 at its slot start, which is only the simulator's step and render
time after the tick that steps the state of step i's slot; a tick that runs that little late
would otherwise take the next slot's step. Such a twist waits for its time (with its gripper); a
newer twist that becomes due supersedes every twist received before it. Answers to frames
published before the episode's first frame (a previous episode's) are ignored, twist and
gripper alike. The answers come paired by `answer_pairing.AnswerPairs`; `answer_lag` is the
number of periods between the state an applied answer was planned for and the state it acts on
(`episode_records.EpisodeCounters`).

Camera delay in real time (`DelayedCamera`, `camera_delay` d > 0): the frame rendered at control
period t is published at period t + d, after that period's step and render, keeping its
original header stamp (the time of capture). It models a slow camera pipeline, or a slow model
as the robot sees it: a single-step model's action lands at least d periods after its image was
taken (the bridge applies the newest command on its tick), and the node executes a chunk
time-aligned by the stamp (its steps 0 .. d-1 are past when it arrives and are skipped,
docs/chunks.md). Frames still waiting when the episode ends are never published. The latency
the bridge records stays frame published -> first answer (the node's part, without the camera
delay). `TickMonitor` counts real-time ticks that came late (the timer could not keep the rate).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from vla_spec_ros.sim.answer_pairing import AnswerPairs
from vla_spec_ros.sim.bridge_settings import check_camera_delay
from vla_spec_ros.validation import check_int, check_number

# A real-time tick more than this many control periods after the previous one is late: the
# arm kept the previous command for longer than the rate promises.
LATE_TICK_PERIODS = 1.5


@dataclass
class _ReceivedTwist:
    """A finite twist as received, and the gripper paired with it once that arrives."""

    stamp_ns: int
    linear: tuple
    angular: tuple
    receipt_s: float
    source: tuple | None            # (frame stamp, chunk step) it answers; None for a hold
    gripper: float | None = None


class RealtimeCommand:
    """Newest due command and its age, for a controller stepping at a fixed rate (module doc).

    Only answers to frames of the running episode count: a twist answering a frame stamped
    before the episode's first frame (a chunk step included, whatever its own stamp), and the
    gripper paired with it, are ignored (`num_ignored_answers`). Holds (zero twists with
    unregistered stamps) are always taken: they stop the arm.
    """

    def __init__(self, answers: AnswerPairs, command_timeout_s: float,
                 initial_gripper_position: float, max_waiting: int = 64):
        self._answers = answers
        self._timeout_s = check_number('command_timeout_s', command_timeout_s, above=0.0)
        self._first_stamp_ns: int | None = None     # None: no episode, every answer ignored
        self._twist: _ReceivedTwist | None = None   # in effect
        # Received, not yet in effect (receipt order); bounded in case stamps run far ahead.
        self._waiting: deque = deque(maxlen=check_int('max_waiting', max_waiting, minimum=1))
        self._gripper = float(initial_gripper_position)
        self.num_ignored_answers = 0

    @property
    def is_hold(self) -> bool:
        """Whether the twist in effect is a hold (a zero twist answering no frame: the node's
        watchdog, a stale image, a chunk that ran out), not an action."""
        return self._twist is not None and self._twist.source is None

    @property
    def source(self) -> tuple[int, int] | None:
        """(frame stamp, chunk step index) the twist in effect answers; None for a hold or
        none."""
        return None if self._twist is None else self._twist.source

    def begin_episode(self, first_stamp_ns: int, initial_gripper_position: float) -> None:
        """Forget the previous command; from now on answers to frames >= first_stamp_ns."""
        self._first_stamp_ns = int(first_stamp_ns)
        self._twist = None
        self._waiting.clear()
        self._gripper = float(initial_gripper_position)
        self.num_ignored_answers = 0

    def _is_current(self, stamp_ns: int) -> bool:
        return self._first_stamp_ns is not None and stamp_ns >= self._first_stamp_ns

    def on_twist(self, stamp_ns: int, linear, angular, receipt_s: float) -> None:
        located = self._answers.registry.frame_of(stamp_ns, self._answers.chunk_period_s)
        self._answers.on_twist(stamp_ns, linear, angular)
        if located is not None and not self._is_current(located[0]):
            self.num_ignored_answers += 1
        elif all(math.isfinite(v) for v in tuple(linear) + tuple(angular)):
            self._waiting.append(_ReceivedTwist(int(stamp_ns), tuple(linear), tuple(angular),
                                                float(receipt_s), located))
        self._apply_grippers()

    def on_gripper(self, position: float) -> None:
        self._answers.on_gripper(position)
        self._apply_grippers()

    def _apply_grippers(self) -> None:
        """Attach each paired gripper to its twist: at once when that twist is in effect, else
        when it takes effect; a superseded or ignored twist's gripper is dropped."""
        for pair in self._answers.pop():
            if not (self._is_current(pair.stamp_ns) and math.isfinite(pair.gripper_position)):
                continue
            key = (pair.stamp_ns, pair.step_index)
            if self._twist is not None and self._twist.source == key:
                self._twist.gripper = self._gripper = pair.gripper_position
                continue
            for twist in self._waiting:
                if twist.source == key:
                    twist.gripper = pair.gripper_position
                    break

    def command_at(self, now_s: float,
                   due_stamp_ns: int | None = None) -> tuple[tuple, tuple, float, bool]:
        """(linear, angular, gripper position, is_fresh) at `now_s` (receipt clock). The newest
        received twist stamped at or before `due_stamp_ns` (None: any) takes effect, and every
        twist received before it is dropped; a stale or missing twist gives zero motion, the
        gripper keeps its newest value."""
        newest = None
        for index, twist in enumerate(self._waiting):
            if due_stamp_ns is None or twist.stamp_ns <= due_stamp_ns:
                newest = index
        if newest is not None:
            for _ in range(newest):
                self._waiting.popleft()
            self._twist = self._waiting.popleft()
            if self._twist.gripper is not None:
                self._gripper = self._twist.gripper
        twist = self._twist
        if twist is None or now_s - twist.receipt_s > self._timeout_s:
            return (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), self._gripper, False
        return twist.linear, twist.angular, self._gripper, True


def due_stamp_ns(state_stamp_ns: int, control_period_s: float) -> int:
    """The latest twist stamp applied to the state captured at `state_stamp_ns`: half a
    control period later (module doc, real time)."""
    return int(state_stamp_ns) + round(0.5 * control_period_s * 1e9)


def answer_lag(step_period: int, frame_period: int, step_index: int) -> int:
    """Periods between the state an answer was planned for (its frame's period + its chunk
    step) and the state of `step_period` it is applied to (EpisodeCounters)."""
    return int(step_period) - (int(frame_period) + int(step_index))


class DelayedCamera:
    """The frames of a real-time episode between capture and publication (module doc).

    Per control period t, in order: the bridge steps the simulator, renders, `capture(t,
    frame)`, then publishes `due(t)`: every frame captured at period <= t - camera_delay,
    oldest first. With camera_delay 0 a frame is due in the period it was captured.
    `frame` is opaque here (the bridge's stamped message).
    """

    def __init__(self, camera_delay: int = 0):
        self.camera_delay = check_camera_delay(camera_delay)
        self._waiting: deque = deque()     # (period it is due, frame), oldest first
        self._last_period: int | None = None

    def begin_episode(self) -> None:
        """Forget the frames of the previous episode (never published)."""
        self._waiting.clear()
        self._last_period = None

    def __len__(self) -> int:
        return len(self._waiting)

    def capture(self, period: int, frame) -> None:
        """The frame rendered at control `period` (periods strictly increase per episode)."""
        period = check_int('period', period, minimum=0)
        if self._last_period is not None and period <= self._last_period:
            raise ValueError(f'period: {period} is not after the last capture '
                             f'{self._last_period}')
        self._last_period = period
        self._waiting.append((period + self.camera_delay, frame))

    def due(self, period: int) -> list:
        """The frames to publish at control `period`, oldest first (each once)."""
        out = []
        while self._waiting and self._waiting[0][0] <= period:
            out.append(self._waiting.popleft()[1])
        return out


class TickMonitor:
    """Real-time ticks against the control period: a tick more than LATE_TICK_PERIODS periods
    after the previous one is late (the machine could not keep the rate; the simulator then
    runs slower than the node's clock, and the node skips the chunk steps whose slots passed)."""

    def __init__(self, period_s: float):
        self.period_s = check_number('period_s', period_s, above=0.0)
        self.begin_episode()

    def begin_episode(self, start_s: float | None = None) -> None:
        """`start_s`: when the episode's first frame was captured (the first tick's reference)."""
        self._last_s = start_s
        self.num_late_ticks = 0
        self.max_gap_s = 0.0

    def on_tick(self, now_s: float) -> bool:
        """Record a tick at `now_s` (monotonic seconds); True when it was late."""
        gap = None if self._last_s is None else now_s - self._last_s
        self._last_s = now_s
        if gap is None:
            return False
        self.max_gap_s = max(self.max_gap_s, gap)
        is_late = gap > LATE_TICK_PERIODS * self.period_s
        self.num_late_ticks += int(is_late)
        return is_late


__all__ = ['LATE_TICK_PERIODS', 'RealtimeCommand', 'due_stamp_ns', 'answer_lag', 'DelayedCamera',
           'TickMonitor']
