"""One robot's state input: sensor_msgs/JointState or a plain Float64MultiArray, kept with its
time and read at an observation's time (docs/action_spaces.md). Two input adapters
(input_adapter.py), key 'state', one per `state_input` choice: JointStateInput and
ArrayStateInput, over the history and pairing they share (StateInput).

  state_input joint_state  <prefix>joint_states (sensor_msgs/JointState): the state vector is
                           the positions of `state_joint_names` (else `joint_names`), selected
                           by name in that order, whatever the message's order. A robot's
                           /joint_states carries every joint (gripper fingers, a mobile base,
                           a second arm): joints not configured are ignored, whatever their
                           values, and so is a message that names none of the configured
                           joints (another publisher's on the same topic: a gripper driver
                           beside the arm's controller). A configured joint missing from a
                           message that names others, or named twice, a position
                           count that differs from the name count, or a non-finite position
                           of a configured joint is bad input: the frame it would pair with is
                           refused with the reason naming the joints (zero motion).
  state_input array        <prefix>state (std_msgs/Float64MultiArray): the data as is (its
                           length must be len(state_joint_names or joint_names) when those
                           are set); no header, so its time is its receipt time.

Pairing with an image: the state received closest in time to the observation (its header
stamp, else receipt); further than `max_state_age` from it (or none yet): stale input, the
robot holds. The vector goes to the engine raw, in joint order (Frame.state); the family
normalises it as its checkpoint defines.
"""
from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.input_adapter import InputAdapter
from vla_spec_ros.ros.qos import IMAGE_QOS

MAX_STATES = 256        # states kept (a 500 Hz joint_states topic: half a second)
MAX_NAMES_SHOWN = 12    # a refusal quotes at most this many of the message's joint names


def state_from_joint_state(names, positions, order) -> np.ndarray:
    """The positions of `order`'s joints, selected by name from a JointState's (names,
    positions); the message's other joints are ignored. ValueError naming the configured
    joints that are missing, named twice or not finite."""
    names, positions = list(names), list(positions)
    if len(names) != len(positions):
        raise ValueError(f'state: JointState has {len(names)} names and {len(positions)} '
                         'positions')
    index: dict = {}
    for i, name in enumerate(names):
        index.setdefault(name, []).append(i)
    missing = [j for j in order if j not in index]
    if missing:
        shown = names[:MAX_NAMES_SHOWN] + (['...'] if len(names) > MAX_NAMES_SHOWN else [])
        raise ValueError(f'state: JointState missing joints {missing} (state_joint_names: '
                         f'{list(order)}; the message names {shown})')
    # A configured joint named twice has no one position: which one the robot meant is
    # unknown, so the state is refused rather than guessed.
    repeated = [j for j in order if len(index[j]) > 1]
    if repeated:
        raise ValueError(f'state: JointState names joints {repeated} more than once')
    vector = np.array([positions[index[j][0]] for j in order], dtype=np.float64)
    bad = [j for j, v in zip(order, vector) if not math.isfinite(v)]
    if bad:
        raise ValueError(f'state: non-finite position of {bad}')
    return vector


def state_from_array(data, order) -> np.ndarray:
    vector = np.asarray(list(data), dtype=np.float64)
    if order and len(vector) != len(order):
        raise ValueError(f'state: {len(vector)} values, expected {len(order)} '
                         f'({list(order)})')
    if not np.all(np.isfinite(vector)):
        raise ValueError(f'state: non-finite values {np.array2string(vector, precision=4)}')
    return vector


class StateInput(InputAdapter):
    """One robot's recent states and their pairing with an observation (module docstring);
    a subclass subscribes its message type and calls `_add`. `get_settings()`: the robot's
    NodeSettings in force."""

    key = 'state'

    def __init__(self, node, get_settings):
        self.node = node
        self._get_settings = get_settings
        self._lock = threading.Lock()
        self._states: deque = deque(maxlen=MAX_STATES)  # (time_s, vector or None, error)
        self._sub = None

    def _now_s(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def _add(self, time_s: float, vector, error) -> None:
        with self._lock:
            self._states.append((time_s, vector, error))

    def read_at(self, time_s: float, settings):
        """(vector, None), or (None, (reason, is_bad_input)) for the observation at `time_s`:
        the state received closest in time; stale beyond max_state_age (or none yet); bad
        input when that state's message was (input_adapter.py's contract)."""
        with self._lock:
            nearest = min(self._states, key=lambda s: abs(s[0] - time_s), default=None)
        if nearest is None:
            return None, (f'{cmd.REASON_STALE}: no robot state received yet', False)
        gap = nearest[0] - time_s
        if abs(gap) > settings.max_state_age:
            return None, (f'{cmd.REASON_STALE}: the nearest robot state is {gap:+.3f} s from '
                          f'the image, beyond max_state_age {settings.max_state_age:.3f} s',
                          False)
        if nearest[2] is not None:
            return None, (f'{cmd.REASON_BAD_INPUT}: {nearest[2]}', True)
        return nearest[1], None

    def current_positions(self, settings):
        """The newest state's positions of `joint_names` (JointState order mapped), when it
        is younger than max_state_age on the node clock; else None."""
        with self._lock:
            newest = self._states[-1] if self._states else None
        if newest is None or newest[1] is None:
            return None
        if self._now_s() - newest[0] > settings.max_state_age:
            return None
        order = list(settings.state_order)
        try:
            return tuple(float(newest[1][order.index(j)]) for j in settings.joint_names)
        except ValueError:          # a joint of the action is not in the state
            return None

    def destroy(self) -> None:
        if self._sub is not None:
            self.node.destroy_subscription(self._sub)


class JointStateInput(StateInput):
    """state_input joint_state: <prefix>joint_states, the positions of state_order's joints
    selected by name; the header stamp (else the receipt time) is the state's time."""

    def __init__(self, node, prefix: str, get_settings):
        from sensor_msgs.msg import JointState

        super().__init__(node, get_settings)
        self._sub = node.create_subscription(JointState, prefix + 'joint_states',
                                             self._on_joint_state, IMAGE_QOS)

    def _on_joint_state(self, msg) -> None:
        order = self._get_settings().state_order
        if not set(msg.name) & set(order):
            return          # another publisher's joints only: not this state's message
        stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        try:
            vector, error = state_from_joint_state(msg.name, msg.position, order), None
        except ValueError as exc:
            vector, error = None, str(exc)
        self._add(stamp_s if stamp_s > 0.0 else self._now_s(), vector, error)


class ArrayStateInput(StateInput):
    """state_input array: <prefix>state (Float64MultiArray), the data as is; no header, so
    the receipt time is the state's time."""

    def __init__(self, node, prefix: str, get_settings):
        from std_msgs.msg import Float64MultiArray

        super().__init__(node, get_settings)
        self._sub = node.create_subscription(Float64MultiArray, prefix + 'state',
                                             self._on_array, IMAGE_QOS)

    def _on_array(self, msg) -> None:
        try:
            vector, error = state_from_array(msg.data, self._get_settings().state_order), None
        except ValueError as exc:
            vector, error = None, str(exc)
        self._add(self._now_s(), vector, error)


__all__ = ['StateInput', 'JointStateInput', 'ArrayStateInput', 'state_from_joint_state',
           'state_from_array', 'MAX_STATES']
