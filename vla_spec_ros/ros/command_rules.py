"""From an ActionResult to what the node publishes, and the safety decisions (S7 in
docs/architecture.md).

Pure Python + numpy, no rclpy: every rule here is unit-tested on its own.

Action convention (OpenVLA, docs/openvla.md): a 7-vector of end-effector deltas over one
control step, dx, dy, dz (m), droll, dpitch, dyaw (rad), then the gripper (1 open, 0 closed).
Twist (REP-103, SI units): velocity = delta / control_period * scale, where the angular delta
is the rotation vector of droll, dpitch, dyaw (the rotation a twist integrates to, motion.py;
docs/robot.md, "Rotations"); then each of the linear and angular parts is clamped by its norm
to the configured limit, which keeps the direction of motion (MoveIt Servo caps speed_units
commands the same way).

Safety: disabled, an engine error, an invalid action (non-action token, NaN / Inf), a stale
observation, or a stamp from the future give a zero twist and *hold* the gripper (no gripper
command is sent, so a forward command controller keeps its last position); the reason string
goes to the log and /diagnostics.

A chunked model's steps go through `decide_command` one at a time, each with its own age
(chunk_rules.py, docs/chunks.md).

Joint action spaces (`action_space`, docs/action_spaces.md): the action's first
len(joint_names) values are per-joint velocities (joint_velocity, rad/s or m/s) or positions
(joint_position, rad or m), each clamped to its joint's limit from the parameters
(joint_max_velocity: +-limit; joint_position_min / max); one more value, when the checkpoint
has it, is the gripper (mapped as above). The same checks (finite, shape, fresh) come first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vla_spec_ros.motion import clamp_norm, rotation_vector_from_rpy
from vla_spec_ros.ros.message_time import stamp_at, stamp_ns
from vla_spec_ros.ros.params import NodeSettings

ACTION_DIM = 7

# Reason prefixes; diagnostics and the halt logic group holds by these.
REASON_DISABLED = 'disabled'
REASON_NO_IMAGE = 'no image received'
REASON_NO_INSTRUCTION = 'no instruction'
REASON_STALE = 'stale observation'
REASON_FUTURE = 'observation from the future'
REASON_ENGINE_ERROR = 'engine error'
REASON_INVALID = 'invalid action'
REASON_NON_FINITE = 'non-finite action'
REASON_BAD_INPUT = 'bad input'
# A chunked model's newest chunk has no step left and no newer chunk arrived (docs/chunks.md).
REASON_CHUNK_END = 'chunk ran out'
# With servo_node: MoveIt Servo is not there or its command type is not selected (yet, or
# again after a restart), so it would drop the command (servo_contract.py).
REASON_SERVO_NOT_READY = 'servo not ready'
# What the robot was doing was dropped: its instruction changed (nothing decided under the old
# one goes out) or `~/reset` (or a jump back of the node clock) forgot it. Zero until the next
# action.
REASON_NEW_INSTRUCTION = 'instruction changed'
REASON_RESET = 'reset'

# Holds caused by a failure (diagnostics level ERROR) rather than by a state (WARN).
FAILURE_REASONS = (REASON_ENGINE_ERROR, REASON_INVALID, REASON_NON_FINITE, REASON_BAD_INPUT)

ZERO3 = (0.0, 0.0, 0.0)


def has_instruction(instruction: str) -> bool:
    """Whether the robot has a task: an instruction of only whitespace is none (the engine
    would refuse every frame of it as bad input, at frame rate)."""
    return bool(instruction.strip())


def instruction_change_reason(instruction: str) -> str:
    """The hold after the robot's instruction changed to `instruction` (cleared: none)."""
    if not has_instruction(instruction):
        return REASON_NO_INSTRUCTION
    return f'{REASON_NEW_INSTRUCTION}: holding until the first action for {instruction!r}'


@dataclass(frozen=True)
class Command:
    """One output of the node: a twist, a gripper command, the raw action, or a hold."""

    linear: tuple           # (3,) m/s
    angular: tuple          # (3,) rad/s
    gripper: float | None   # controller position; None = hold (send nothing)
    action: tuple | None    # (D,) the un-normalized action it came from; None on hold
    hold_reason: str | None = None
    joints: tuple | None = None     # joint spaces: (n,) clamped joint velocities / positions

    @property
    def is_hold(self) -> bool:
        return self.hold_reason is not None


def zero_command(reason: str) -> Command:
    """Zero twist, gripper held, with the reason."""
    if not reason:
        raise ValueError('reason: a hold needs a reason')
    return Command(ZERO3, ZERO3, None, None, reason)


def reason_kind(reason: str | None) -> str | None:
    """'stale observation: age 0.7 s > ...' -> 'stale observation'."""
    return None if reason is None else reason.split(':', 1)[0]


def is_stale_reason(reason: str | None) -> bool:
    """Whether a hold reason counts as a stale result in the statistics: an image too old,
    or stamped in the future."""
    return reason_kind(reason) in (REASON_STALE, REASON_FUTURE)


def displacement_dims(settings: NodeSettings) -> int:
    """How many leading action values are a displacement over control_period (divided by it
    to make a velocity: velocities_from_action): the six motion values of ee_delta; none of
    the joint spaces' (velocities, or absolute positions)."""
    return 6 if settings.action_space == 'ee_delta' else 0


def velocities_from_action(action: np.ndarray, settings: NodeSettings) -> tuple[tuple, tuple]:
    """(7,) delta action -> (linear (3,), angular (3,)) velocities, scaled and clamped. The
    angular velocity is the rotation vector of the action's fixed-axis angles over the period
    (motion.py): integrated for one period, as Servo does, it turns the tool by exactly the
    action's rotation."""
    action = np.asarray(action, dtype=np.float64)
    linear = action[0:3] / settings.control_period * settings.linear_scale
    angular = (rotation_vector_from_rpy(action[3:6]) / settings.control_period
               * settings.angular_scale)
    linear = clamp_norm(linear, settings.max_linear_speed)
    angular = clamp_norm(angular, settings.max_angular_speed)
    return tuple(float(v) for v in linear), tuple(float(v) for v in angular)


def gripper_position(value: float, settings: NodeSettings) -> float:
    """Model gripper value (1 open, 0 closed) -> controller position.

    Order: invert (1 - value), then either binarize at the threshold (value >= threshold is
    open) or clip to [0, 1], then interpolate closed -> open position.
    """
    value = float(value)
    if settings.gripper_invert:
        value = 1.0 - value
    if settings.gripper_binarize:
        openness = 1.0 if value >= settings.gripper_threshold else 0.0
    else:
        openness = min(max(value, 0.0), 1.0)
    closed, opened = settings.gripper_closed_position, settings.gripper_open_position
    return closed + openness * (opened - closed)


def action_dims(settings: NodeSettings) -> tuple[int, ...]:
    """The action dimensions `settings.action_space` can take: 7 for end-effector deltas;
    len(joint_names), or one more with a gripper, for the joint spaces."""
    if settings.action_space == 'ee_delta':
        return (ACTION_DIM,)
    return (len(settings.joint_names), len(settings.joint_names) + 1)


def check_action_dim(action_dim: int, settings: NodeSettings) -> None:
    """ValueError naming the parameter when the checkpoint's action dimension does not fit
    the configured action space (at start-up, before anything is published)."""
    if action_dim in action_dims(settings):
        return
    if settings.action_space == 'ee_delta':
        raise ValueError(f'action_space: ee_delta needs 7 action values (dx, dy, dz, droll, '
                         f'dpitch, dyaw, gripper); the checkpoint decides {action_dim}')
    raise ValueError(f'joint_names: {len(settings.joint_names)} joints '
                     f'{list(settings.joint_names)} but the checkpoint decides {action_dim} '
                     f'action values (expected {len(settings.joint_names)}, or one more for '
                     'the gripper)')


def joint_values(action: np.ndarray, settings: NodeSettings) -> tuple:
    """The action's joint values clamped per joint (module docstring)."""
    values = np.asarray(action, dtype=np.float64)[:len(settings.joint_names)]
    if settings.action_space == 'joint_velocity':
        limit = np.asarray(settings.joint_max_velocity, dtype=np.float64)
        values = np.clip(values, -limit, limit)
    else:
        values = np.clip(values, np.asarray(settings.joint_position_min, dtype=np.float64),
                         np.asarray(settings.joint_position_max, dtype=np.float64))
    return tuple(float(v) for v in values)


def command_from_action(action: np.ndarray, settings: NodeSettings) -> Command:
    """A finite action -> the command to publish (no safety checks; see decide_command)."""
    action = np.asarray(action, dtype=np.float64)
    if action.ndim != 1 or len(action) not in action_dims(settings):
        raise ValueError(f'action: expected shape ({action_dims(settings)[-1]},), got '
                         f'{action.shape}')
    raw = tuple(float(v) for v in action)
    if settings.action_space != 'ee_delta':
        num_joints = len(settings.joint_names)
        gripper = (gripper_position(action[num_joints], settings)
                   if len(action) > num_joints else None)
        return Command(ZERO3, ZERO3, gripper, raw, joints=joint_values(action, settings))
    linear, angular = velocities_from_action(action, settings)
    return Command(linear, angular, gripper_position(action[6], settings), raw)


def observation_time(stamp_s: float, receipt_s: float, settings: NodeSettings) -> float:
    """When the observation was made (node clock seconds): its header stamp or its receipt
    time (stamp_source). A zero header stamp (driver that does not stamp) falls back to the
    receipt time."""
    if settings.stamp_source == 'header' and stamp_s > 0.0:
        return stamp_s
    return receipt_s


def aged_from(stamp_s: float, receipt_s: float, settings: NodeSettings) -> float:
    """The node-clock time an accepted observation is aged and timed from: its
    observation_time, but never later than its arrival (no image arrives before it is taken,
    so a stamp ahead of its own arrival is a camera clock running ahead of the node's). A
    chunk's steps are timed from it too (chunk_execution.py), so that offset neither delays
    the hold after the camera stops nor the chunk's steps."""
    return min(observation_time(stamp_s, receipt_s, settings), receipt_s)


def command_stamp(info, settings: NodeSettings):
    """The header stamp of the commands decided from an observation (`info`: a FrameInfo):
    its image's stamp, unless the node does not age the image by that stamp (aged_from):
    then its arrival on the node clock. A camera clock ahead of the node's (accepted within
    max_action_age), or any camera clock with ``stamp_source: receipt``, would otherwise reach
    MoveIt Servo, which counts its incoming_command_timeout from the command's stamp: a
    command stamped ahead stands longer than the timeout if the node stops."""
    arrival = info.receipt_stamp if info.receipt_stamp is not None else stamp_at(
        info.stamp, info.receipt_s)
    if settings.stamp_source != 'header':
        return arrival
    if info.stamp_s <= 0.0:            # unstamped: info.stamp is the image's own arrival
        return info.stamp
    # Compared in whole nanoseconds: an arrival in the same nanosecond as the stamp (one
    # simulated clock tick) keeps the image's own stamp.
    return info.stamp if stamp_ns(info.stamp) <= stamp_ns(arrival) else arrival


def observation_age(now_s: float, stamp_s: float, receipt_s: float,
                    settings: NodeSettings) -> float:
    """Seconds since the observation, from its header stamp or its receipt (stamp_source),
    and never less than the time since its receipt (aged_from): within max_action_age a
    stamp ahead of its arrival is accepted, but the image is aged from its arrival, so the
    hold after the camera stops is not late by the offset. A stamp further ahead keeps its
    negative age: freshness_reason refuses it as from the future (a clock mismatch)."""
    age = now_s - observation_time(stamp_s, receipt_s, settings)
    if age < -settings.max_action_age:
        return age
    return now_s - aged_from(stamp_s, receipt_s, settings)


def freshness_reason(age_s: float | None, settings: NodeSettings, *,
                     max_age_s: float | None = None) -> str | None:
    """None when an observation of this age may be acted on, else why not. `max_age_s`
    (default max_action_age) is the limit; a chunk's image may be older than a single
    action's (chunk_rules.chunk_age_limit)."""
    if age_s is None:
        return REASON_NO_IMAGE
    limit = settings.max_action_age if max_age_s is None else max_age_s
    if age_s > limit:
        name = 'max_action_age' if max_age_s is None else 'the chunk limit'
        return f'{REASON_STALE}: age {age_s:.3f} s > {name} {limit:.3f} s'
    # A stamp far in the future means the camera's clock is not the node's (sim time vs wall
    # time); acting on such frames would defeat the age check, so they are held too.
    if age_s < -settings.max_action_age:
        return (f'{REASON_FUTURE}: stamp {-age_s:.3f} s ahead of the node clock '
                '(clock mismatch? check use_sim_time)')
    return None


def hold_reason_now(is_enabled: bool, age_s: float | None, settings: NodeSettings, *,
                    max_age_s: float | None = None) -> str | None:
    """What the watchdog holds for when no action is due: disabled or no fresh image."""
    if not is_enabled:
        return REASON_DISABLED
    return freshness_reason(age_s, settings, max_age_s=max_age_s)


def decide_command(result, *, error: str | None, is_enabled: bool, age_s: float | None,
                   settings: NodeSettings, action_dim: int = ACTION_DIM) -> Command:
    """The safety decision for one finished frame (S7), in order of precedence.

    `result`: an ActionResult (or None when `error` is set); `age_s`: its observation's age
    at publish time; `action_dim`: the checkpoint's action dimension (check_action_dim).
    """
    if not is_enabled:
        return zero_command(REASON_DISABLED)
    if error is not None or result is None:
        return zero_command(f'{REASON_ENGINE_ERROR}: {error or "no result"}')
    if not result.is_valid:
        return zero_command(f'{REASON_INVALID}: {result.invalid_reason or "unspecified"}')
    action = np.asarray(result.action, dtype=np.float64)
    if action.shape != (action_dim,):
        return zero_command(f'{REASON_INVALID}: action has shape {action.shape}, '
                            f'expected ({action_dim},)')
    if not np.all(np.isfinite(action)):
        return zero_command(f'{REASON_NON_FINITE}: {np.array2string(action, precision=4)}')
    stale = freshness_reason(age_s, settings)
    if stale is not None:
        return zero_command(stale)
    command = command_from_action(action, settings)
    values = command.linear + command.angular + (command.joints or ()) + (
        () if command.gripper is None else (command.gripper,))
    if not all(math.isfinite(v) for v in values):
        return zero_command(f'{REASON_NON_FINITE}: command overflowed')
    return command


__all__ = ['Command', 'zero_command', 'action_dims', 'check_action_dim', 'joint_values',
           'reason_kind', 'is_stale_reason', 'displacement_dims', 'velocities_from_action',
           'gripper_position', 'command_from_action', 'observation_time', 'aged_from',
           'command_stamp', 'observation_age', 'freshness_reason', 'hold_reason_now',
           'decide_command', 'FAILURE_REASONS', 'ACTION_DIM', 'REASON_CHUNK_END',
           'REASON_SERVO_NOT_READY']
