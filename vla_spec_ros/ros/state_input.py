"""One robot's state input: sensor_msgs/JointState or a plain Float64MultiArray, kept with its
time and read at an observation's time (docs/action_spaces.md). Two input adapters
(input_adapter.py), key 'state', one per `state_input` choice: JointStateInput and
ArrayStateInput.

  state_input joint_state  <prefix>joint_states (sensor_msgs/JointState): the state vector is
                           the positions of `state_joint_names` (else `joint_names`), selected
                           by name in that order, whatever the message's order. A message may
                           carry any subset of the robot's joints: a whole robot's
                           /joint_states (gripper fingers, a mobile base, a second arm), or one
                           of several publishers sharing the topic (an arm controller and a
                           gripper driver), as robot_state_publisher merges them. Each
                           configured joint keeps its own positions with their message's
                           time; joints not configured are ignored, whatever their values.
                           The positions of `joint_names` are kept too, whether or not the
                           model's state reads them: the joint outputs' hold and speed bound
                           start from where the joints are (current_positions).
                           A configured joint named twice in a message, or with a non-finite
                           position, and a message whose position count differs from its name
                           count, are bad input for the joints they name: the frame that
                           pairs with such a position is refused with the reason (zero
                           motion).
  state_input array        <prefix>state (std_msgs/Float64MultiArray): the data as is (its
                           length must be len(state_joint_names or joint_names) when those
                           are set); no header, so its time is its receipt time.

Pairing with an image: for each configured joint (the array: for the whole vector), the
position received closest in time to the observation (its header stamp, else receipt);
further than `max_state_age` from it (or none yet): stale input, the robot holds, naming the
joints. Every sample of the last max_action_age + max_state_age (+ 1 s) is kept, whatever
the topic's rate (sample_history.py). The vector goes to the engine raw, in joint order
(Frame.state); the family normalises it as its checkpoint defines.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.input_adapter import InputAdapter
from vla_spec_ros.ros.message_time import checked_header_seconds
from vla_spec_ros.ros.qos import STATE_QOS
from vla_spec_ros.ros.sample_history import SampleHistory

# Beyond the oldest image that can still be answered (max_action_age) and the furthest its
# state may be from it (max_state_age), a little more, so a stale pairing says how far it was.
KEEP_MARGIN_S = 1.0


def joint_positions(names, positions, order) -> dict:
    """{joint: (position, None) or (None, reason)} for the joints of `order` a JointState's
    (names, positions) carries; the message's other joints are ignored. A configured joint
    named twice or not finite gets its reason (bad input); no positions at all is a message
    of velocities or efforts (JointState allows empty arrays): nothing; ValueError when the
    name and position counts differ otherwise (no position can be trusted)."""
    names, positions = list(names), list(positions)
    if not positions:            # allowed: a publisher of velocities or efforts only
        return {}
    if len(names) != len(positions):
        raise ValueError(f'state: JointState has {len(names)} names and {len(positions)} '
                         'positions')
    index: dict = {}
    for i, name in enumerate(names):
        index.setdefault(name, []).append(i)
    out = {}
    for joint in order:
        where = index.get(joint)
        if where is None:
            continue
        if len(where) > 1:
            # Which position the robot meant is unknown: refused rather than guessed.
            out[joint] = (None, f'state: JointState names joint {joint!r} more than once')
            continue
        value = float(positions[where[0]])
        out[joint] = ((value, None) if math.isfinite(value)
                      else (None, f'state: non-finite position of {joint!r}'))
    return out


def state_from_array(data, order) -> np.ndarray:
    vector = np.asarray(list(data), dtype=np.float64)
    if order and len(vector) != len(order):
        raise ValueError(f'state: {len(vector)} values, expected {len(order)} '
                         f'({list(order)})')
    if not np.all(np.isfinite(vector)):
        raise ValueError(f'state: non-finite values {np.array2string(vector, precision=4)}')
    return vector


class StateInput(InputAdapter):
    """One robot's recent states and their pairing with an observation (module docstring):
    samples (time_s, value or None, error or None) kept per key, the whole vector under one
    key for an array, one key per joint for a JointState; a subclass subscribes its message
    type, calls `_add` and says which keys make the state (`_keys`). `get_settings()`: the
    robot's NodeSettings in force."""

    key = 'state'

    def __init__(self, node, get_settings):
        self.node = node
        self._get_settings = get_settings
        self._lock = threading.Lock()
        self._samples: dict = {}       # key -> SampleHistory of (time_s, value or None, error)
        self._sub = None

    def _now_s(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def forget(self) -> None:
        """The node clock went back: every state kept is of the old time line."""
        with self._lock:
            self._samples.clear()

    def _add(self, time_s: float, samples: dict, settings=None) -> None:
        """One message's samples, {key: (value or None, error or None)}, at `time_s`: the
        settings (`settings`, else read here) and the clock read once per message, not per
        joint."""
        settings = settings or self._get_settings()
        keep_s = settings.max_action_age + settings.max_state_age + KEEP_MARGIN_S
        now_s = self._now_s()
        with self._lock:
            for key, (value, error) in samples.items():
                self._samples.setdefault(key, SampleHistory()).add((time_s, value, error),
                                                                   now_s, keep_s)

    def _keys(self, settings) -> list:
        raise NotImplementedError

    def _vector(self, values) -> np.ndarray:
        """The state vector from the keys' values, in `_keys` order."""
        raise NotImplementedError

    def _describe(self, keys) -> str:
        return 'robot state'

    def read_at(self, time_s: float, settings):
        """(vector, None), or (None, (reason, is_bad_input)) for the observation at `time_s`:
        per key, the sample received closest in time; stale beyond max_state_age (or none
        yet); bad input when that sample's message was (input_adapter.py's contract)."""
        keys = self._keys(settings)
        with self._lock:
            nearest = [self._samples[k].nearest(time_s) if k in self._samples else None
                       for k in keys]
        missing = [k for k, n in zip(keys, nearest) if n is None]
        if missing:
            return None, (f'{cmd.REASON_STALE}: no {self._describe(missing)} received yet',
                          False)
        far = [(k, n[0] - time_s) for k, n in zip(keys, nearest)
               if abs(n[0] - time_s) > settings.max_state_age]
        if far:
            gap = max((g for _, g in far), key=abs)
            return None, (f'{cmd.REASON_STALE}: the nearest {self._describe([k for k, _ in far])} '
                          f'is {gap:+.3f} s from the image, beyond max_state_age '
                          f'{settings.max_state_age:.3f} s', False)
        error = next((n[2] for n in nearest if n[2] is not None), None)
        if error is not None:
            return None, (f'{cmd.REASON_BAD_INPUT}: {error}', True)
        return self._vector([n[1] for n in nearest]), None

    def _newest_fresh(self, keys, settings) -> list | None:
        """The newest value of each key when every one is within max_state_age of the node
        clock (either side: a state stamped ahead by more is of another clock, not a fresh
        one) and none was bad input; else None."""
        with self._lock:
            newest = [self._samples[k].last_received if k in self._samples else None
                      for k in keys]
        now = self._now_s()
        if any(n is None or n[1] is None or abs(now - n[0]) > settings.max_state_age
               for n in newest):
            return None
        return [n[1] for n in newest]

    def current_positions(self, settings):
        """The newest positions of `joint_names` when every one is fresh
        (`_newest_fresh`); else None."""
        raise NotImplementedError

    def destroy(self) -> None:
        if self._sub is not None:
            self.node.destroy_subscription(self._sub)


class JointStateInput(StateInput):
    """state_input joint_state: <prefix>joint_states, each configured joint's positions kept
    apart, whichever message carried them; the header stamp (else the receipt time) is a
    position's time."""

    def __init__(self, node, prefix: str, get_settings):
        from sensor_msgs.msg import JointState

        super().__init__(node, get_settings)
        self._sub = node.create_subscription(JointState, prefix + 'joint_states',
                                             self._on_joint_state, STATE_QOS)

    def _keys(self, settings) -> list:
        return list(settings.state_order)

    def _vector(self, values) -> np.ndarray:
        return np.array(values, dtype=np.float64)

    def _describe(self, keys) -> str:
        return f'robot state (position of joints {list(keys)})'

    def current_positions(self, settings):
        """The newest position of each of `joint_names`, read by name (kept whether or not
        the state reads it), when every one is fresh (`_newest_fresh`); else None."""
        if not settings.joint_names:
            return None
        values = self._newest_fresh(list(settings.joint_names), settings)
        return None if values is None else tuple(float(v) for v in values)

    def _on_joint_state(self, msg) -> None:
        settings = self._get_settings()
        # The state's joints, then the action's (the joint outputs' start; module docstring).
        order = list(dict.fromkeys(list(settings.state_order) + list(settings.joint_names)))
        names = set(msg.name)
        named = [j for j in order if j in names]
        if not named:
            return          # another publisher's joints only: nothing of this state
        stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        time_s = stamp_s if stamp_s > 0.0 else self._now_s()    # 0 alone means unstamped
        try:
            checked_header_seconds(msg)          # a stamp below zero is bad input
            samples = joint_positions(msg.name, msg.position, order)
        except ValueError as exc:        # no position of this message can be trusted
            samples = {j: (None, str(exc)) for j in named}
        self._add(time_s, samples, settings)


class ArrayStateInput(StateInput):
    """state_input array: <prefix>state (Float64MultiArray), the data as is; no header, so
    the receipt time is the state's time."""

    def __init__(self, node, prefix: str, get_settings):
        from std_msgs.msg import Float64MultiArray

        super().__init__(node, get_settings)
        self._sub = node.create_subscription(Float64MultiArray, prefix + 'state',
                                             self._on_array, STATE_QOS)

    def _keys(self, settings) -> list:
        return ['state']

    def _vector(self, values) -> np.ndarray:
        return values[0]

    def current_positions(self, settings):
        """The newest positions of `joint_names`, mapped through the array's order, when
        the array is fresh (`_newest_fresh`); else None."""
        values = self._newest_fresh(self._keys(settings), settings)
        if values is None:
            return None
        vector = self._vector(values)
        order = list(settings.state_order)
        if len(vector) != len(order):   # kept under another state_joint_names
            return None
        try:
            return tuple(float(vector[order.index(j)]) for j in settings.joint_names)
        except ValueError:          # a joint of the action is not in the state
            return None

    def _on_array(self, msg) -> None:
        try:
            vector, error = state_from_array(msg.data, self._get_settings().state_order), None
        except ValueError as exc:
            vector, error = None, str(exc)
        self._add(self._now_s(), {'state': (vector, error)})


__all__ = ['StateInput', 'JointStateInput', 'ArrayStateInput', 'joint_positions',
           'state_from_array']
