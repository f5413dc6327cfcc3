"""Simulator side of the command path: twist + gripper in, a 7-dim action out (no rclpy, no torch).

The `vla_spec` node turns an action into commands (vla_spec_ros/ros/command.py):

    linear  = clamp_norm(d[0:3] / control_period * linear_scale,  max_linear_speed)
    angular = clamp_norm(d[3:6] / control_period * angular_scale, max_angular_speed)
    gripper = closed + openness * (open - closed)        (openness in [0, 1], 1 = open)

`action_from_twist` inverts it: the bridge clamps the velocity norms like a servo controller,
then d = velocity * control_period / scale and openness = (gripper - closed) / (open - closed)
clipped to [0, 1]. The inversion is exact (up to float rounding) when the bridge's
control_period, scales, speed limits and gripper positions equal the VLA node's and the node did
not clamp; a clamped velocity stays clamped (the direction is kept, the length is not).

Pairing answers. The node publishes, for every action, the twist stamped with the frame's stamp
and then its gripper message, from one thread (node.py `_publish_command`) over reliable topics;
zero-twist holds are stamped with the node clock and carry no gripper. So, over the node's
whole life (not per frame, not per episode), the n-th twist whose stamp is a published frame's
pairs with the n-th gripper message: `AnswerPairs` keeps one FIFO of each and pops pairs in
order. Pairing by position inside a per-frame window would go wrong as soon as a gripper
arrived after the next frame began (a late duplicate answer shifts every later pair by one).
A chunked model's node publishes step i of a frame's chunk with the stamp frame stamp +
round(i * control_period * 1e9) ns (ros/robot_channel.offset_stamp), each step with its gripper:
`FrameRegistry.frame_of` recognises such stamps (the bridge's control_period equals the node's),
so chunk steps pair like answers and `MatchedCommand` carries the frame stamp and step index.

Two ways to turn a stream of commands into simulator steps:
- lock-step (`LockstepMatcher`): frame k is stepped with the pair whose twist carries frame k's
  stamp; pairs answering other frames (late or duplicate answers) are counted, never applied.
  With a chunked model that is the first step the node publishes for frame k (step 0, or the
  step due when the chunk arrived); the chunk's later steps arrive on the node's clock and are
  counted as other answers. `vla-spec demo` refuses lock-step for chunked models for that
  reason (one step per frame is not the chunk's plan); its delay part executes chunks
  time-aligned in process, and real time executes them as the node publishes them.
  A frame may be published again `max_republish` times, then the episode fails
  (`should_republish`): a held answer (e.g. an invalid token) repeats for the same frame.
- real time (`RealtimeCommand`): every control period the newest twist that is due is used
  when it was received less than `command_timeout_s` ago, else zero motion; the gripper holds
  its last value (a servo controller's incoming-command timeout). Due: stamped no later than
  the state being stepped (its frame's stamp) + half a control period. The node publishes a
  chunk's step i + 1 at its slot start, which is only the simulator's step and render time after
  the tick that steps the state of step i's slot; a tick that runs that little late would
  otherwise take the next slot's step. Such a twist waits for its time (with its gripper); a
  newer twist that becomes due supersedes every twist received before it. Answers to frames
  published before the episode's first frame (a previous episode's) are ignored, twist and
  gripper alike.

Camera delay in real time (`DelayedCamera`, `camera_delay` d > 0): the frame rendered at control
period t is published at period t + d, after that period's step and render, keeping its
original header stamp (the time of capture). It models a slow camera pipeline, or a slow model
as the robot sees it: a single-step model's action lands at least d periods after its image was
taken (the bridge applies the newest command on its tick), and the node executes a chunk
time-aligned by the stamp (its steps 0 .. d-1 are past when it arrives and are skipped,
docs/chunks.md). Frames still waiting when the episode ends are never published. The latency
the bridge records stays frame published -> first answer (the node's part, without the camera
delay). `TickMonitor` counts real-time ticks that came late (the timer could not keep the rate).

Delayed lock-step (`DelayedLockstep`, lock-step with `action_delay` d > 0): still lock-step
(every answer is awaited, so a run is deterministic and independent of the machine's speed),
but the action decided from the frame of control period k is applied at period k + d, as if
inference took d periods. Until it lands the arm holds (`delay_hold`): the previous applied
action, or zero motion (the gripper keeps its last value either way; before the first answer:
zero motion, gripper open). `delay_frames` says which frames reach the policy: "every" (a
pipelined policy: every period's frame is answered, each d periods later) or "one_in_flight"
(a policy that takes a new frame only when the previous answer has landed: the frames of
periods 0, d, 2d, ...; each answer then holds for d periods). d = 0 is plain lock-step. The
same object drives the bridge node and the in-process episode loop (`sim.demos.run_episode`),
so both apply the same actions at the same periods.

Action chunks (a policy answering a (K, 7) plan per frame, docs/chunks.md): the delayed lock-step
executes a chunk on the control clock, time-aligned, like the VLA node does. Step i of the chunk
decided from period t's frame is due at period t + i (`chunk_step_due`); the chunk lands at
period t + d, so its steps 0 .. d-1 are past and skipped and step d is applied first. The newest
chunk that has landed wins (the node's `chunk_blend: latest`): an older chunk's remaining steps
are dropped. When the newest chunk has no step left (it ran out, or d >= K so every step was
past when it landed), the arm holds as above (`delay_hold`). A (7,) answer keeps the
single-step rule: it is applied when it lands, whatever d. With d = 0 and every frame answered
a chunked policy applies step 0 of each chunk (a new chunk every period); with one frame in
flight it applies steps d .. 2d-1 of each chunk (those before the next chunk lands), holding
for the ones beyond K - 1.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields

import numpy as np

from vla_spec_ros.motion import clamp_norm
from vla_spec_ros.validation import check_int, check_number

SIM_MODES = ('lockstep', 'realtime')
ACTION_DIM = 7
DELAY_HOLDS = ('previous', 'zero')
DELAY_FRAMES = ('every', 'one_in_flight')
MAX_ACTION_DELAY = 1000
MAX_CAMERA_DELAY = 1000
# A real-time tick more than this many control periods after the previous one is late: the
# arm kept the previous command for longer than the rate promises.
LATE_TICK_PERIODS = 1.5
# Longest chunk whose step stamps `FrameRegistry.frame_of` traces back to their frame.
MAX_CHUNK_STEPS = 256

# Command conventions a VLA node and a bridge must share for the bridge to recover each action
# exactly: unit scales, speed limits far above Meta-World's 1 cm steps (a clamp would change the
# action), gripper message = the model's gripper value in [0, 1] (1 = open).
SHARED_COMMAND_PARAMETERS = {
    'linear_scale': 1.0, 'angular_scale': 1.0, 'max_linear_speed': 10.0,
    'max_angular_speed': 20.0, 'gripper_open_position': 1.0, 'gripper_closed_position': 0.0,
}
# Lock-step waits for each action before the next frame exists (a republished frame keeps its
# stamp), so the observation age grows with the inference time; the VLA node's max_action_age
# (also its watchdog's limit) is set to its maximum there so waiting never turns into a stale
# hold. In real time the node's own limit applies.
MAX_ACTION_AGE_S = {'lockstep': 60.0, 'realtime': 1.0}


def matched_command_parameters(control_rate_hz: float, sim_mode: str) -> tuple[dict, dict]:
    """(VLA node overrides, bridge overrides) with the same control period and conventions."""
    if sim_mode not in SIM_MODES:
        raise ValueError(f'sim_mode: {sim_mode!r} not in {list(SIM_MODES)}')
    control_rate_hz = check_number('control_rate_hz', control_rate_hz, above=0.0)
    period = 1.0 / control_rate_hz
    shared = dict(SHARED_COMMAND_PARAMETERS, control_period=period)
    vla = dict(shared, gripper_binarize=False, gripper_invert=False, enabled=True,
               max_action_age=MAX_ACTION_AGE_S[sim_mode])
    bridge = dict(shared, control_rate_hz=float(control_rate_hz), sim_mode=sim_mode,
                  command_timeout_s=max(0.5, 3.0 * period))
    return vla, bridge


@dataclass(frozen=True)
class BridgeSettings:
    """Parameters of the simulator bridge node; validated at construction.

    control_period, the scales, the speed limits and the gripper positions must equal the VLA
    node's parameters of the same names, else actions are not recovered exactly.
    """

    task_name: str = 'button-press-topdown'
    seed: int = 0
    episodes: int = 1
    instruction: str = ''
    image_size: int = 64
    camera: str = 'corner4'
    max_steps: int = 150
    frame_id: str = 'camera'
    sim_mode: str = 'lockstep'
    control_rate_hz: float = 5.0
    control_period: float = 0.2
    linear_scale: float = 1.0
    angular_scale: float = 1.0
    max_linear_speed: float = 0.25
    max_angular_speed: float = 1.0
    gripper_open_position: float = 1.0
    gripper_closed_position: float = 0.0
    lockstep_timeout_s: float = 5.0
    max_republish: int = 3
    command_timeout_s: float = 0.5
    instruction_settle_s: float = 0.5
    episode_timeout_s: float = 600.0
    action_delay: int = 0
    delay_hold: str = 'previous'
    delay_frames: str = 'every'
    camera_delay: int = 0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, float):
                object.__setattr__(self, f.name, check_number(f.name, value))
            elif isinstance(f.default, int) and not isinstance(f.default, bool):
                object.__setattr__(self, f.name, check_int(f.name, value))
            elif type(value) is not type(f.default):
                raise ValueError(f'{f.name}: expected {type(f.default).__name__}, got '
                                 f'{value!r}')
        if self.sim_mode not in SIM_MODES:
            raise ValueError(f'sim_mode: {self.sim_mode!r} not in {list(SIM_MODES)}')
        check_delay(self.action_delay, self.delay_hold, self.delay_frames)
        if self.action_delay and self.sim_mode != 'lockstep':
            raise ValueError('action_delay: applies to sim_mode lockstep only (real time has '
                             'the delay of the real inference; see camera_delay)')
        check_camera_delay(self.camera_delay, self.sim_mode)
        for name in ('control_rate_hz', 'control_period', 'linear_scale', 'angular_scale',
                     'lockstep_timeout_s', 'command_timeout_s', 'episode_timeout_s'):
            # > 0: a zero scale cannot be inverted
            check_number(name, getattr(self, name), above=0.0)
        for name in ('max_linear_speed', 'max_angular_speed', 'instruction_settle_s'):
            check_number(name, getattr(self, name), minimum=0.0)
        for name in ('seed', 'episodes', 'max_steps', 'image_size', 'max_republish'):
            check_int(name, getattr(self, name),
                      minimum=0 if name in ('seed', 'max_republish') else 1)
        if self.gripper_open_position == self.gripper_closed_position:
            raise ValueError('gripper_open_position: must differ from gripper_closed_position')
        if not self.frame_id.strip():
            raise ValueError('frame_id: must not be empty')


# ROS parameter descriptions of the fields above (the bridge declares one parameter each).
DESCRIPTIONS = {
    'task_name': 'Meta-World task run by main()', 'seed': 'Base seed of main()\'s episodes',
    'episodes': 'Episodes run by main()', 'instruction': 'Instruction for main()\'s episodes; '
    'empty = the task phrasing chosen from the episode seed',
    'image_size': 'Camera image side in pixels (the model\'s input size, else the VLA node '
    'resizes)', 'camera': 'Meta-World camera name',
    'max_steps': 'Steps before an episode ends unsuccessfully',
    'frame_id': 'frame_id of ~/image', 'sim_mode': 'lockstep or realtime',
    'control_rate_hz': 'Real-time step rate', 'control_period': 'Seconds one action delta '
    'spans (must match the VLA node)', 'linear_scale': 'Must match the VLA node',
    'angular_scale': 'Must match the VLA node', 'max_linear_speed': 'Servo limit on the linear '
    'velocity norm (m/s)', 'max_angular_speed': 'Servo limit on the angular velocity norm',
    'gripper_open_position': 'Gripper command meaning open (must match the VLA node)',
    'gripper_closed_position': 'Gripper command meaning closed (must match the VLA node)',
    'lockstep_timeout_s': 'Republish the frame after this long without its command',
    'max_republish': 'Lock-step: republications of one frame before the episode fails',
    'command_timeout_s': 'Real time: older commands give zero motion',
    'instruction_settle_s': 'Pause after publishing a new instruction before the first frame',
    'episode_timeout_s': 'main(): give up on an episode after this long',
    'action_delay': 'Lock-step: apply the action decided from period k\'s frame at period '
    'k + action_delay (0 = plain lock-step)',
    'delay_hold': 'Delayed lock-step: while no new action lands, hold the previous action or '
    'zero motion (previous, zero; the gripper keeps its value)',
    'delay_frames': 'Delayed lock-step: frames sent to the policy: every (pipelined) or '
    'one_in_flight (a new frame only when the previous answer landed)',
    'camera_delay': 'Real time: publish the frame rendered at control period t at period '
    't + camera_delay, keeping its capture stamp (a slow camera pipeline; 0 = at once)',
}


def check_delay(action_delay, delay_hold: str = 'previous', delay_frames: str = 'every') -> int:
    """The delay settings, validated (ValueError naming the field); returns `action_delay`."""
    check_int('action_delay', action_delay, minimum=0, maximum=MAX_ACTION_DELAY,
              unit='control periods')
    if delay_hold not in DELAY_HOLDS:
        raise ValueError(f'delay_hold: {delay_hold!r} not in {list(DELAY_HOLDS)}')
    if delay_frames not in DELAY_FRAMES:
        raise ValueError(f'delay_frames: {delay_frames!r} not in {list(DELAY_FRAMES)}')
    return action_delay


def check_camera_delay(camera_delay, sim_mode: str = 'realtime') -> int:
    """`camera_delay` validated (ValueError naming the field): an int in [0,
    MAX_CAMERA_DELAY] control periods, > 0 in real time only (lock-step has action_delay)."""
    check_int('camera_delay', camera_delay, minimum=0, maximum=MAX_CAMERA_DELAY,
              unit='control periods')
    if camera_delay and sim_mode != 'realtime':
        raise ValueError('camera_delay: applies to sim_mode realtime only (lock-step waits for '
                         'every answer; its delay is action_delay)')
    return camera_delay


def gripper_openness(position: float, settings: BridgeSettings) -> float:
    """Controller position -> absolute gripper in [0, 1] (1 = open), the inverse of the
    node's interpolation closed -> open."""
    closed, opened = settings.gripper_closed_position, settings.gripper_open_position
    openness = (float(position) - closed) / (opened - closed)
    return min(max(openness, 0.0), 1.0)


def action_from_twist(linear, angular, gripper_position: float,
                      settings: BridgeSettings) -> np.ndarray:
    """(3,) m/s, (3,) rad/s, controller position -> (7,) float64 action (deltas per step)."""
    linear = np.asarray(linear, dtype=np.float64)
    angular = np.asarray(angular, dtype=np.float64)
    if linear.shape != (3,) or angular.shape != (3,):
        raise ValueError(f'linear/angular: expected (3,) each, got {linear.shape}, '
                         f'{angular.shape}')
    if not (np.all(np.isfinite(linear)) and np.all(np.isfinite(angular))
            and math.isfinite(gripper_position)):
        raise ValueError('linear/angular/gripper_position: non-finite command')
    linear = clamp_norm(linear, settings.max_linear_speed)
    angular = clamp_norm(angular, settings.max_angular_speed)
    action = np.empty(ACTION_DIM, dtype=np.float64)
    action[0:3] = linear * settings.control_period / settings.linear_scale
    action[3:6] = angular * settings.control_period / settings.angular_scale
    action[6] = gripper_openness(gripper_position, settings)
    return action


def next_stamp_ns(now_ns: int, last_ns: int | None) -> int:
    """A frame stamp from the clock, forced strictly above the previous one."""
    return int(now_ns) if last_ns is None or now_ns > last_ns else int(last_ns) + 1


class FrameRegistry:
    """Stamps of recently published frames and when each was first published.

    Tells answers to published frames (action twists) from other twists, and measures
    observation-to-command latency once per frame (the first answer). Only the newest
    `max_frames` stamps are kept: an answer to an older frame would look like a hold and shift
    the pairing in `AnswerPairs`, so the default covers far more frames than any answer can lag
    (the VLA node refuses observations older than its max_action_age).
    """

    def __init__(self, max_frames: int = 16384):
        self._max_frames = check_int('max_frames', max_frames, minimum=1)
        self._published: OrderedDict[int, float] = OrderedDict()   # stamp_ns -> publish time
        self._answered: set[int] = set()

    def add(self, stamp_ns: int, published_s: float) -> None:
        if self._published and stamp_ns <= next(reversed(self._published)):
            raise ValueError(f'stamp_ns: {stamp_ns} is not above the previous frame stamp')
        self._published[stamp_ns] = published_s
        while len(self._published) > self._max_frames:
            old, _ = self._published.popitem(last=False)
            self._answered.discard(old)

    def __contains__(self, stamp_ns: int) -> bool:
        return stamp_ns in self._published

    def frame_of(self, stamp_ns: int, step_period_s: float | None = None,
                 max_steps: int = MAX_CHUNK_STEPS) -> tuple[int, int] | None:
        """(frame stamp, chunk step index) of a twist stamp: (stamp, 0) for a frame's own
        stamp; with `step_period_s`, (frame, i) when stamp = frame + round(i * step_period_s *
        1e9) ns for a registered frame (the node's stamp of chunk step i); else None."""
        if stamp_ns in self._published:
            return int(stamp_ns), 0
        if not step_period_s or not self._published:
            return None
        oldest = next(iter(self._published))
        for index in range(1, max_steps):
            frame = int(stamp_ns) - round(index * step_period_s * 1e9)
            if frame < oldest:
                break
            if frame in self._published:
                return frame, index
        return None

    def first_answer_latency(self, stamp_ns: int, received_s: float) -> float | None:
        """Seconds from the frame's first publication to this answer; None when the stamp is
        unknown or the frame was answered before."""
        if stamp_ns not in self._published or stamp_ns in self._answered:
            return None
        self._answered.add(stamp_ns)
        return received_s - self._published[stamp_ns]


@dataclass(frozen=True)
class MatchedCommand:
    """One answer: the twist answering a published frame (stamped with the frame's stamp, or
    for step i of a chunk the frame's stamp + i control periods) and its gripper message."""

    stamp_ns: int               # the frame's stamp
    linear: tuple
    angular: tuple
    gripper_position: float
    step_index: int = 0         # the chunk step (0 for a single-step model)

    @property
    def is_finite(self) -> bool:
        return all(math.isfinite(v) for v in self.linear + self.angular
                   + (self.gripper_position,))


class AnswerPairs:
    """FIFOs of answering twists and of gripper messages for the node's whole life (module doc).

    Every twist whose stamp is a registered frame's (or, with `chunk_period_s`, a chunk step's
    of a registered frame) goes in, finite or not, and so does every gripper message (a NaN
    position for an unreadable one): dropping one side only would shift every later pair.
    `max_pending` bounds each FIFO (the oldest entries go first) in case one topic loses
    messages.
    """

    def __init__(self, registry: FrameRegistry, max_pending: int = 1024,
                 chunk_period_s: float | None = None):
        check_int('max_pending', max_pending, minimum=1)
        self.registry = registry
        self.chunk_period_s = chunk_period_s
        self._twists: deque = deque(maxlen=max_pending)   # (frame, step, linear, angular)
        self._grippers: deque = deque(maxlen=max_pending)   # positions

    def on_twist(self, stamp_ns: int, linear, angular) -> bool:
        """Queue a twist; True when it answers a registered frame (so a gripper follows it)."""
        located = self.registry.frame_of(stamp_ns, self.chunk_period_s)
        if located is None:
            return False                 # a hold: node-clock stamp, no gripper message
        self._twists.append(located + (tuple(float(v) for v in linear),
                                       tuple(float(v) for v in angular)))
        return True

    def on_gripper(self, position: float) -> None:
        self._grippers.append(float(position))

    def pop(self) -> list[MatchedCommand]:
        """Every complete pair received so far, oldest first."""
        pairs = []
        while self._twists and self._grippers:
            stamp_ns, index, linear, angular = self._twists.popleft()
            pairs.append(MatchedCommand(stamp_ns, linear, angular, self._grippers.popleft(),
                                        index))
        return pairs


class LockstepMatcher:
    """The current frame's command out of the node's answers, plus the republication budget.

    One matcher serves the node's whole life (its `AnswerPairs` must not be emptied); the
    counters restart with `begin_episode`.
    """

    def __init__(self, answers: AnswerPairs, max_republish: int = 3):
        self._answers = answers
        self._max_republish = check_int('max_republish', max_republish, minimum=0)
        self._current: int | None = None
        self.num_republished = 0       # republications of the current frame
        # This episode's answers not applied: to other frames (late, duplicate) or non-finite.
        self.num_other_answers = 0

    def begin_episode(self) -> None:
        self.num_other_answers = 0

    def begin_frame(self, stamp_ns: int) -> None:
        """A new frame (not a republication) waits for its command. Call before publishing."""
        if stamp_ns not in self._answers.registry:
            raise ValueError(f'stamp_ns: {stamp_ns} was not added to the registry')
        self._current = stamp_ns
        self.num_republished = 0

    def end(self) -> None:
        """No frame waits for a command (episode over)."""
        self._current = None

    def should_republish(self) -> bool:
        """The current frame's command is overdue: True = publish the frame again (counted),
        False = `max_republish` republications did not help; the episode should fail."""
        if self.num_republished >= self._max_republish:
            return False
        self.num_republished += 1
        return True

    def on_twist(self, stamp_ns: int, linear, angular) -> bool:
        """Record a twist; True when it answers a published frame (and so has a gripper)."""
        return self._answers.on_twist(stamp_ns, linear, angular)

    def on_gripper(self, position: float) -> None:
        self._answers.on_gripper(position)

    def take(self) -> MatchedCommand | None:
        """The current frame's command once its twist and gripper have both arrived (at most
        once per frame); every other complete pair is counted in `num_other_answers`."""
        command = None
        for pair in self._answers.pop():
            if self._current is not None and pair.stamp_ns == self._current and pair.is_finite:
                command, self._current = pair, None
            else:
                self.num_other_answers += 1
        return command


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


def chunk_step_due(frame_period: int, num_steps: int, period: int) -> int | None:
    """The step of a chunk decided from `frame_period`'s frame that is due at `period` (step i
    covers period frame_period + i), or None when that period lies before the chunk or after its
    last step."""
    index = period - frame_period
    return index if 0 <= index < num_steps else None


class DelayedLockstep:
    """Which action a lock-step episode applies at each control period (module doc).

    Per period t, in order: `wants_frame(t)`; if True, the policy's action for period t's
    frame goes to `answer(t, action)`; then `action_at(t)` is the action to step with, and
    whether it is a fresh answer (False: a hold). Actions are 7-dim (deltas per step,
    absolute gripper in [0, 1]), or (K, 7) chunks executed time-aligned (module doc; a chunk's
    step counts as fresh). `source` tells where the last `action_at` came from: (frame period,
    step index) of the chunk step applied, (frame period, None) for a single action, None for a
    hold. A frame without a valid answer never reaches this object:
    lock-step ends that episode (the bridge after `max_republish` republications, the
    in-process loop at once).
    """

    def __init__(self, action_delay: int = 0, delay_hold: str = 'previous',
                 delay_frames: str = 'every', initial_gripper: float = 1.0):
        self.action_delay = check_delay(action_delay, delay_hold, delay_frames)
        self.delay_hold, self.delay_frames = delay_hold, delay_frames
        self._initial_gripper = float(initial_gripper)
        self.begin_episode()

    def begin_episode(self) -> None:
        self._pending: deque = deque()   # (period the answer lands, frame period, answer)
        self._last = np.r_[np.zeros(ACTION_DIM - 1), self._initial_gripper]
        self._chunk: tuple | None = None   # (frame period, (K, 7) steps): the newest landed
        self._next_period = 0
        self.num_fresh = self.num_held = 0
        self.num_chunk_steps_skipped = 0     # chunk steps past when their chunk landed
        self.num_chunks_replaced = 0         # chunks that landed with steps still due
        self.num_run_outs = 0     # the newest chunk had no step left (ran out, or all past)
        self.source: tuple | None = None

    def wants_frame(self, period: int) -> bool:
        """Whether period t's frame goes to the policy."""
        d = self.action_delay
        return self.delay_frames == 'every' or d == 0 or period % d == 0

    def answer(self, period: int, action) -> None:
        """The policy's answer for period t's frame (a wanted one, before `action_at(t)`): a
        (7,) action or a (K, 7) chunk."""
        if period != self._next_period or not self.wants_frame(period):
            raise ValueError(f'period: {period} is not the current period '
                             f'{self._next_period} or its frame was not wanted')
        if self._pending and self._pending[-1][0] >= period + self.action_delay:
            raise ValueError(f'period: {period} was answered already')
        action = np.array(action, dtype=np.float64)
        if (action.shape[-1:] != (ACTION_DIM,) or action.ndim not in (1, 2) or action.size == 0
                or not np.all(np.isfinite(action))):
            raise ValueError(f'action: expected a finite ({ACTION_DIM},) action or (K, '
                             f'{ACTION_DIM}) chunk, got {action}')
        self._pending.append((period + self.action_delay, period, action))

    def action_at(self, period: int) -> tuple[np.ndarray, bool]:
        """(action applied at period t, is_fresh); call once per period, in order."""
        if period != self._next_period:
            raise ValueError(f'period: expected {self._next_period}, got {period}')
        if self.wants_frame(period) and not (
                self._pending and self._pending[-1][0] == period + self.action_delay):
            raise ValueError(f'period: {period}\'s frame was not answered')
        self._next_period += 1
        if self._pending and self._pending[0][0] == period:
            _, frame_period, action = self._pending.popleft()
            if action.ndim == 1:              # a single action: applied when it lands
                self._chunk = None
                return self._apply(action, (frame_period, None))
            if self._chunk is not None and chunk_step_due(
                    self._chunk[0], len(self._chunk[1]), period) is not None:
                self.num_chunks_replaced += 1
            self._chunk = (frame_period, action)
            self.num_chunk_steps_skipped += min(period - frame_period, len(action))
        if self._chunk is not None:
            frame_period, steps = self._chunk
            index = chunk_step_due(frame_period, len(steps), period)
            if index is not None:
                return self._apply(steps[index], (frame_period, index))
            self._chunk = None
            self.num_run_outs += 1
        self.num_held += 1
        self.source = None
        if self.delay_hold == 'zero':
            self._last = np.r_[np.zeros(ACTION_DIM - 1), self._last[ACTION_DIM - 1]]
        return self._last.copy(), False

    def _apply(self, action: np.ndarray, source: tuple) -> tuple[np.ndarray, bool]:
        self._last = action
        self.num_fresh += 1
        self.source = source
        return action.copy(), True


# Why an episode ended (EpisodeLog.end_reason).
END_SUCCESS, END_MAX_STEPS, END_TIMEOUT = 'success', 'max_steps', 'timeout'
END_UNANSWERED, END_STOPPED = 'unanswered', 'stopped'


@dataclass
class EpisodeCounters:
    num_steps: int = 0
    num_frames_published: int = 0       # republications included
    num_commands_applied: int = 0       # steps taken with a received command
    num_stale_commands: int = 0         # real time: steps with zero motion (stale / missing);
    #                                     delayed lock-step: steps with a held action
    num_republished_frames: int = 0     # lock-step: frames sent again after a timeout
    num_other_answers: int = 0          # answers not applied: lock-step, to other frames;
    #                                     real time, to an earlier episode's frames
    is_timed_out: bool = False          # episode_timeout_s / run_episode's timeout
    is_unanswered: bool = False         # lock-step: a frame unanswered after max_republish
    num_hold_commands: int = 0          # real time: steps with a hold twist (zero, no frame)
    # Real time, steps applying an answer: lag = the step's control period - (its frame's
    # period + its chunk step), i.e. how many periods after the state it was planned for it
    # was applied (0: time-aligned; a single-step answer to a frame d periods old: >= d).
    num_answer_steps: int = 0
    answer_lag_sum: int = 0
    num_answer_steps_on_time: int = 0   # lag 0
    num_answer_steps_early: int = 0     # lag < 0 (a late tick took the next slot's step)
    num_late_ticks: int = 0             # real time: ticks > LATE_TICK_PERIODS after the last
    max_tick_gap_s: float = 0.0         # real time: the longest time between two ticks


@dataclass
class EpisodeLog:
    """Everything recorded about one episode; `result` is None while it runs."""

    counters: EpisodeCounters = field(default_factory=EpisodeCounters)
    applied_actions: list = field(default_factory=list)    # (7,) float64 per step
    latencies_s: list = field(default_factory=list)        # frame published -> first answer
    wall_s: float = 0.0
    result: object = None                                  # sim.demos.EpisodeResult
    end_reason: str = ''                                   # END_*; '' while it runs


__all__ = ['SIM_MODES', 'BridgeSettings', 'DESCRIPTIONS', 'gripper_openness', 'action_from_twist',
           'next_stamp_ns', 'FrameRegistry', 'DelayedLockstep', 'chunk_step_due', 'check_delay',
           'check_camera_delay', 'DelayedCamera', 'TickMonitor', 'MAX_CAMERA_DELAY',
           'LATE_TICK_PERIODS', 'answer_lag', 'due_stamp_ns',
           'DELAY_HOLDS', 'DELAY_FRAMES', 'MAX_CHUNK_STEPS', 'MatchedCommand', 'AnswerPairs',
           'LockstepMatcher', 'RealtimeCommand', 'EpisodeCounters', 'EpisodeLog', 'END_SUCCESS',
           'END_MAX_STEPS', 'END_TIMEOUT', 'END_UNANSWERED', 'END_STOPPED']
