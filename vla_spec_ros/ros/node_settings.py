"""`NodeSettings`: everything the node needs besides the engine, frozen and validated at
construction (each value against its `ParameterSpec`, then the rules between values: inputs,
action space, joint limits), and the value checks the parameter mapping shares. Pure Python.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vla_spec_ros.ros.param_table import IMAGE_TRANSPORTS, PARAMETERS_BY_NAME, ParameterSpec
from vla_spec_ros.validation import check_int, check_number


@dataclass(frozen=True)
class NodeSettings:
    """Everything the node needs besides the engine; validated at construction.

    Defaults live only in `PARAMETERS`; `default_node_settings()` builds them.
    """

    model_path: str
    robots: tuple
    image_transport: str
    image_slots: tuple
    image_transports: tuple
    image_sync_tolerance: float
    state_input: str
    state_joint_names: tuple
    max_state_age: float
    action_space: str
    joint_names: tuple
    joint_max_velocity: tuple
    joint_position_min: tuple
    joint_position_max: tuple
    instruction: str
    unnorm_key: str
    enabled: bool
    frame_id: str
    control_period: float
    linear_scale: float
    angular_scale: float
    max_linear_speed: float
    max_angular_speed: float
    gripper_binarize: bool
    gripper_threshold: float
    gripper_invert: bool
    gripper_open_position: float
    gripper_closed_position: float
    gripper_action_name: str
    gripper_max_effort: float
    gripper_action_type: str
    gripper_joint_name: str
    servo_node: str
    servo_command_type: str
    servo_pause_on_hold: bool
    pose_targets: bool
    tool_pose_topic: str
    tool_frame: str
    pose_delta_frame: str
    chunk_blend: str
    chunk_ensemble_decay: float
    invalid_chunk: str
    max_action_age: float
    stamp_source: str
    num_halt_messages: int
    watchdog_period: float
    diagnostics_period: float
    torch_threads: int
    record_dir: str
    record_period: float
    record_max_mb: int
    record_split_s: float

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = _check_value(PARAMETERS_BY_NAME[field.name], getattr(self, field.name))
            object.__setattr__(self, field.name, value)
        if not self.model_path:
            raise ValueError('model_path: must not be empty')
        if not self.frame_id.strip():
            raise ValueError('frame_id: must not be empty (MoveIt Servo drops such commands)')
        if self.control_period <= 0:
            raise ValueError('control_period: must be > 0')
        if self.gripper_action_name and not self.gripper_action_name.strip('/'):
            raise ValueError('gripper_action_name: not a valid action name')
        if self.servo_node and not self.servo_node.strip('/'):
            raise ValueError('servo_node: not a valid node name')
        if self.servo_node and self.servo_command_type == 'pose' and not self.pose_targets:
            raise ValueError('servo_command_type: pose needs pose_targets: true (the node '
                             'publishes pose targets only then)')
        if self.pose_targets and not self.tool_frame.strip():
            raise ValueError('tool_frame: must not be empty with pose_targets')
        self._check_inputs()
        self._check_action_space()

    def _check_inputs(self) -> None:
        if self.image_transports and len(self.image_transports) != self.num_image_slots:
            raise ValueError(f'image_transports: {len(self.image_transports)} values for '
                             f'{self.num_image_slots} image slots')
        for transport in self.image_transports:
            if transport not in IMAGE_TRANSPORTS:
                raise ValueError(f'image_transports: {transport!r} not in '
                                 f'{list(IMAGE_TRANSPORTS)}')
        if self.state_input == 'joint_state' and not self.state_order:
            raise ValueError('state_joint_names: state_input joint_state needs the joint order '
                             '(state_joint_names, or joint_names)')
        _check_unique('state_joint_names', self.state_joint_names)

    def _check_action_space(self) -> None:
        joints, n = self.joint_names, len(self.joint_names)
        _check_unique('joint_names', joints)
        if self.action_space == 'ee_delta':
            if self.servo_node and self.servo_command_type == 'joint_jog':
                raise ValueError('servo_command_type: joint_jog needs action_space '
                                 'joint_velocity')
            return
        if not n:
            raise ValueError(f'joint_names: action_space {self.action_space} needs the '
                             'action\'s joint names')
        if self.pose_targets:
            raise ValueError('pose_targets: end-effector targets need action_space ee_delta')
        if self.servo_node and self.servo_command_type != 'joint_jog':
            raise ValueError(f'servo_command_type: {self.servo_command_type!r} with action_space '
                             f'{self.action_space}; Servo takes joint commands as joint_jog')
        if self.servo_node and self.action_space != 'joint_velocity':
            raise ValueError('servo_node: MoveIt Servo takes joint velocities (JointJog), not '
                             'joint positions; use a JointTrajectoryController')
        if self.action_space == 'joint_velocity':
            _check_limits('joint_max_velocity', self.joint_max_velocity, n, minimum=0.0)
        else:
            _check_limits('joint_position_min', self.joint_position_min, n)
            _check_limits('joint_position_max', self.joint_position_max, n)
            for joint, lo, hi in zip(joints, self.joint_position_min, self.joint_position_max):
                if lo >= hi:
                    raise ValueError(
                        f'joint_position_min: {joint} lower limit {lo} not below its upper '
                        f'limit {hi} (the pair is checked together, and `ros2 param set` and '
                        '`ros2 param load` change one parameter at a time: to move the range '
                        'past its other end, change that end first, or both at once through '
                        'the node\'s set_parameters_atomically service)')
            if self.joint_max_velocity:
                _check_limits('joint_max_velocity', self.joint_max_velocity, n, minimum=0.0)
                if self.state_input == 'none':
                    raise ValueError('joint_max_velocity: with action_space joint_position it '
                                     'bounds each target\'s step from the measured joint '
                                     'positions; set state_input (joint_state or array)')
                unread = [j for j in joints if j not in self.state_order]
                if self.state_input == 'array' and unread:
                    # A JointState carries every joint by name; an array only the state's.
                    raise ValueError(
                        f'joint_max_velocity: bounds each target\'s step from the measured '
                        f'positions, and the state array holds {list(self.state_order)} only, '
                        f'not {unread}; use state_input joint_state (its positions are read '
                        'for joint_names whatever the model reads)')

    @property
    def num_image_slots(self) -> int:
        return max(1, len(self.image_slots))

    @property
    def state_order(self) -> tuple:
        """The joints of the state vector (state_joint_names, else joint_names)."""
        return self.state_joint_names or self.joint_names

    def slot_transport(self, index: int) -> str:
        return self.image_transports[index] if self.image_transports else self.image_transport

    @property
    def unnorm_key_or_none(self) -> str | None:
        return self.unnorm_key or None


def check_value(spec: ParameterSpec, value: Any) -> Any:
    """`_check_value`, for a value from elsewhere than a parameter (a checkpoint's
    recommendation, recommended_settings.py)."""
    return _check_value(spec, value)


def _check_value(spec: ParameterSpec, value: Any) -> Any:
    """`value` (ints widened to float where the parameter is a float); ValueError naming the
    parameter when it has the wrong type or is out of range."""
    expected = type(spec.default)
    if expected is int:
        return check_int(spec.name, value, minimum=spec.min_value, maximum=spec.max_value,
                         unit=spec.unit)
    if expected is float:
        return check_number(spec.name, value, minimum=spec.min_value, maximum=spec.max_value,
                            unit=spec.unit)
    if expected is list:
        return _check_list(spec, value)
    if type(value) is not expected:
        raise ValueError(f'{spec.name}: expected {expected.__name__}, got '
                         f'{type(value).__name__} {value!r}')
    if spec.choices and value not in spec.choices:
        raise ValueError(f'{spec.name}: {value!r} not in {list(spec.choices)}')
    return value


def _check_list(spec: ParameterSpec, value: Any) -> tuple:
    """A list parameter -> tuple of its items' type; None (unset) is the empty list."""
    if spec.items == 'name':
        return _check_robot_names(spec.name, value)
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not hasattr(value, '__iter__'):
        raise ValueError(f'{spec.name}: expected a list, got {value!r}')
    value = list(value)
    if spec.items == 'float':
        return tuple(check_number(f'{spec.name}[{i}]', v, unit=spec.unit)
                     for i, v in enumerate(value))
    if not all(isinstance(v, str) and v for v in value):
        raise ValueError(f'{spec.name}: expected a list of non-empty strings, got {value!r}')
    return tuple(value)


def _check_unique(name: str, values) -> None:
    repeated = sorted({v for v in values if list(values).count(v) > 1})
    if repeated:
        raise ValueError(f'{name}: repeated {repeated}')


def _check_limits(name: str, values, num_joints: int, minimum: float | None = None) -> None:
    if len(values) != num_joints:
        raise ValueError(f'{name}: {len(values)} values for {num_joints} joints (joint_names)')
    if minimum is not None and any(v <= minimum for v in values):
        raise ValueError(f'{name}: every limit must be > {minimum}, got {list(values)}')


def _check_robot_names(name: str, value: Any) -> tuple:
    """Robot names -> tuple; each a ROS name token (letter first, then letters, digits, _),
    unique. None (an unset string-array parameter) is the empty list."""
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ValueError(f'{name}: expected a list of names, got {value!r}')
    for robot in value:
        if not (robot[:1].isalpha() and robot.isascii()
                and robot.replace('_', 'a').isalnum()):
            raise ValueError(f'{name}: {robot!r} is not a valid name (a letter, then letters, '
                             'digits or _)')
    repeated = sorted({r for r in value if list(value).count(r) > 1})
    if repeated:
        raise ValueError(f'{name}: repeated {repeated}')
    return tuple(value)
