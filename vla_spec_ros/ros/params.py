"""ROS 2 parameters of the `vla_spec` node: one table, one mapping function.

Every parameter is declared from `PARAMETERS` with a default, a description and a range
(the joy_teleop / key_teleop idiom). The engine's parameters are derived from EngineConfig's
field metadata (config.py `EngineOption`): their range, default, description and tunability are
written once, there; the node's own parameters are the table below.
`settings_from_parameters` is the single place where parameter values become the frozen
`EngineConfig` and the frozen `NodeSettings` below. The node calls it through
`configuration_from_parameters`, which adds each robot's own settings: one `Configuration`
object, built once at start-up (before anything is subscribed) and handed as is to the policy
loader (its `engine` is the engine's config, no dict in between) and to the serving; again on
every `ros2 param set`, to validate the proposed values and to apply them.

Parameters are either tunable (applied from the next frame: a request keeps the values it was
submitted with) or load-time (the model is built from them; a runtime change is refused with
`load_time_refusal`'s reason).

Pure Python: rcl_interfaces is imported only inside `declare_parameters`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from vla_spec_ros.config import TUNABLE_ENGINE_FIELDS, EngineConfig
from vla_spec_ros.validation import check_int, check_number

IMAGE_TRANSPORTS = ('raw', 'compressed')
STAMP_SOURCES = ('header', 'receipt')
CHUNK_BLENDS = ('latest', 'ensemble')      # chunk_rules.BLENDS
INVALID_CHUNK_RULES = ('continue', 'hold')   # chunk_rules.INVALID_CHUNK_RULES
GRIPPER_ACTION_TYPES = ('gripper_command', 'parallel_gripper')   # gripper_action.py
SERVO_COMMAND_TYPE_CHOICES = ('twist', 'pose', 'joint_jog')   # servo_contract's, published
ACTION_SPACES = ('ee_delta', 'joint_velocity', 'joint_position')   # docs/action_spaces.md
STATE_INPUTS = ('none', 'joint_state', 'array')                     # state_input.py
DELTA_FRAMES = ('base', 'tool')                 # pose_math.DELTA_FRAMES

# EngineConfig fields without a parameter, and why (from their EngineOption).
ENGINE_FIELDS_NOT_EXPOSED = {f.name: f.metadata['option'].not_a_parameter
                             for f in dataclasses.fields(EngineConfig)
                             if f.metadata['option'].not_a_parameter}


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    default: Any                      # its Python type is the parameter type
    description: str
    is_tunable: bool
    target: str                       # 'engine' (EngineConfig field) or 'node' (NodeSettings)
    min_value: float | None = None    # inclusive range, numbers only
    max_value: float | None = None
    choices: tuple = ()
    unit: str = ''
    items: str = ''                   # lists: 'name' (ROS name tokens), 'str' or 'float'


def _p(name, default, description, *, tunable, target='node', lo=None, hi=None, choices=(),
       unit='', items=''):
    return ParameterSpec(name, default, description, tunable, target, lo, hi, tuple(choices),
                         unit, items)


def engine_parameter_specs() -> tuple[ParameterSpec, ...]:
    """One ParameterSpec per exposed EngineConfig field, derived from its EngineOption: the
    range, choices, default, description and tunability are written once, in config.py.
    A field whose default is None (draft_path) becomes a string parameter where '' = None."""
    specs = []
    for f in dataclasses.fields(EngineConfig):
        option = f.metadata['option']
        if option.not_a_parameter:
            continue
        default = '' if f.default is None else f.default
        specs.append(ParameterSpec(f.name, default, option.description, option.is_tunable,
                                   'engine', option.minimum, option.maximum, option.choices,
                                   option.unit))
    return tuple(specs)


NODE_PARAMETERS: tuple[ParameterSpec, ...] = (
    # --- model and robots, load-time --------------------------------------------------------
    _p('model_path', 'metaworld-demo', 'Checkpoint folder in OpenVLA\'s Hugging Face layout, '
       'the embedded model (metaworld-demo) or a random-weight preset (tiny, openvla-7b)',
       tunable=False),
    _p('robots', [], 'Robots served by one engine: for each name, topics <name>/image, '
       '<name>/instruction, <name>/twist, ... and parameters <name>.<parameter>; empty = one '
       'robot on the private topics ~/image, ~/twist, ...', tunable=False, items='name'),
    # --- inputs ----------------------------------------------------------------------------
    _p('image_transport', 'raw', 'Subscribe ~/image (raw) or ~/image/compressed',
       tunable=False, choices=IMAGE_TRANSPORTS),
    _p('image_slots', [], 'The model\'s image slots in its order (e.g. [base, wrist]): one '
       'topic ~/<slot>/image (or .../image/compressed) each, paired by stamp; empty = one '
       'camera on ~/image', tunable=False, items='name'),
    _p('image_transports', [], 'raw or compressed per image slot; empty = image_transport for '
       'every slot', tunable=False, items='str'),
    _p('image_sync_tolerance', 0.02, 'Images of one set: stamps within this of the first '
       'slot\'s', tunable=True, lo=0.0, hi=10.0, unit='s'),
    _p('state_input', 'none', 'Robot state: none, joint_state (sensor_msgs/JointState on '
       '~/joint_states, positions in state_joint_names order) or array (std_msgs/'
       'Float64MultiArray on ~/state)', tunable=False, choices=STATE_INPUTS),
    _p('state_joint_names', [], 'joint_state: the joints of the state vector, in order; empty '
       '= joint_names', tunable=True, items='str'),
    _p('max_state_age', 0.1, 'A state further than this from the image\'s time is stale '
       '(hold)', tunable=True, lo=0.001, hi=60.0, unit='s'),
    _p('instruction', '', 'Language instruction; ~/instruction messages overwrite it',
       tunable=True),
    _p('unnorm_key', '', 'Dataset statistics used to un-normalize actions; empty = the '
       'checkpoint\'s only key', tunable=True),
    # --- outputs ---------------------------------------------------------------------------
    _p('action_space', 'ee_delta', 'What the actions are: ee_delta (end-effector deltas -> '
       '~/twist), joint_velocity (-> control_msgs/JointJog on ~/joint_jog) or joint_position '
       '(-> trajectory_msgs/JointTrajectory on ~/joint_trajectory)', tunable=False,
       choices=ACTION_SPACES),
    _p('joint_names', [], 'Joint spaces: the action\'s joints in action order (an extra last '
       'action value is the gripper)', tunable=True, items='str'),
    _p('joint_max_velocity', [], 'Per-joint speed limit. joint_velocity: each velocity '
       'clamped to +-limit; joint_position (optional, needs state_input): each target within '
       'limit x control_period of the one before, the first of the measured positions',
       tunable=True, items='float', unit='rad/s'),
    _p('joint_position_min', [], 'joint_position: per-joint lower limit of the targets',
       tunable=True, items='float', unit='rad'),
    _p('joint_position_max', [], 'joint_position: per-joint upper limit of the targets',
       tunable=True, items='float', unit='rad'),
    _p('enabled', False, 'Publish actions; false publishes zero twist (also ~/enable)',
       tunable=True),
    _p('frame_id', 'base_link', 'frame_id of ~/twist (MoveIt Servo needs a non-empty one)',
       tunable=True),
    _p('control_period', 0.2, 'Seconds one action delta spans; velocity = delta / '
       'control_period * scale', tunable=True, lo=0.001, hi=10.0, unit='s'),
    _p('linear_scale', 1.0, 'Factor on linear velocities', tunable=True, lo=0.0, hi=10.0),
    _p('angular_scale', 1.0, 'Factor on angular velocities', tunable=True, lo=0.0, hi=10.0),
    _p('max_linear_speed', 0.25, 'Limit on the norm of the linear velocity (direction kept)',
       tunable=True, lo=0.0, hi=10.0, unit='m/s'),
    _p('max_angular_speed', 1.0, 'Limit on the norm of the angular velocity (direction kept)',
       tunable=True, lo=0.0, hi=20.0, unit='rad/s'),
    _p('gripper_binarize', True, 'Snap the gripper value to open / closed at gripper_threshold',
       tunable=True),
    _p('gripper_threshold', 0.5, 'Gripper values at or above this are open', tunable=True,
       lo=0.0, hi=1.0),
    _p('gripper_invert', False, 'Use 1 - value (for checkpoints where 1 means closed)',
       tunable=True),
    _p('gripper_open_position', 1.0, 'Controller command for an open gripper', tunable=True,
       lo=-100.0, hi=100.0),
    _p('gripper_closed_position', 0.0, 'Controller command for a closed gripper',
       tunable=True, lo=-100.0, hi=100.0),
    _p('gripper_action_name', '', 'control_msgs GripperCommand action to also send goals to '
       '(e.g. /gripper_controller/gripper_cmd); empty = none', tunable=False),
    _p('gripper_max_effort', 10.0, 'max_effort of GripperCommand goals (the effort limit of '
       'ParallelGripperCommand goals)', tunable=True, lo=0.0, hi=10000.0, unit='N'),
    _p('gripper_action_type', 'gripper_command', 'Action of gripper_action_name: '
       'gripper_command (control_msgs GripperCommand, GripperActionController) or '
       'parallel_gripper (ParallelGripperCommand, parallel_gripper_action_controller)',
       tunable=False, choices=GRIPPER_ACTION_TYPES),
    _p('gripper_joint_name', '', 'parallel_gripper: the joint named in the goal\'s JointState '
       '(empty = no name)', tunable=True),
    # --- MoveIt Servo's contract and absolute targets (docs/robot.md) --------------------------
    _p('servo_node', '', 'MoveIt Servo node (e.g. /servo_node) whose contract the node keeps: '
       'selects servo_command_type on activation, pauses it on a hold, checks its '
       'incoming_command_timeout; empty = off', tunable=False),
    _p('servo_command_type', 'twist', 'The Servo command type the node selects: twist '
       '(~/twist), pose (~/pose_target; needs pose_targets) or joint_jog (~/joint_jog; '
       'needs action_space joint_velocity)', tunable=False,
       choices=SERVO_COMMAND_TYPE_CHOICES),
    _p('servo_pause_on_hold', True, 'Pause Servo (~/pause_servo) while the robot holds; '
       'resume with the next command', tunable=False),
    _p('pose_targets', False, 'Also publish absolute tool targets: ~/pose_target '
       '(PoseStamped, Servo pose mode) and, for chunked models, ~/pose_trajectory (absolute '
       'poses for a Cartesian trajectory controller); needs the tool pose', tunable=False),
    _p('tool_pose_topic', '', 'PoseStamped of the tool in the robot base frame (from the '
       'driver); empty = TF frame_id -> tool_frame (needs tf2_ros)', tunable=False),
    _p('tool_frame', 'tool0', 'The tool\'s TF frame, and the joint name of ~/pose_trajectory',
       tunable=False),
    _p('pose_delta_frame', 'base', 'Frame the action deltas are applied in for pose targets: '
       'base (OpenVLA\'s datasets) or tool', tunable=True, choices=DELTA_FRAMES),
    # --- chunked models (action_chunk > 1): one step per control period, docs/chunks.md -------
    _p('chunk_blend', 'latest', 'Chunked models: how a new chunk takes over: latest (the '
       'newest chunk from its first due step) or ensemble (the weighted mean of the due step '
       'of every chunk covering it)', tunable=True, choices=CHUNK_BLENDS),
    _p('chunk_ensemble_decay', 0.5, 'chunk_blend ensemble: the j-th newest chunk (0 = the '
       'newest) weighs exp(-decay * j); 0 = plain mean, negative favours older chunks (ACT)',
       tunable=True, lo=-10.0, hi=10.0),
    _p('invalid_chunk', 'continue', 'Chunked models: a chunk that does not decode (wrong '
       'token count or layout) is refused; continue: the chunks already kept go on (each step '
       'still checked for its age), hold: they are dropped and the robot holds until a valid '
       'chunk', tunable=True, choices=INVALID_CHUNK_RULES),
    # --- safety and diagnostics ------------------------------------------------------------
    _p('max_action_age', 0.5, 'Never publish an action whose image is older than this; '
       'publish zero twist instead', tunable=True, lo=0.01, hi=60.0, unit='s'),
    _p('stamp_source', 'header', 'Image age from its header stamp or from its receipt time',
       tunable=True, choices=STAMP_SOURCES),
    _p('num_halt_messages', 4, 'Zero twists published on entering a hold (disabled, stale, '
       'error) before going quiet', tunable=True, lo=1, hi=1000),
    _p('watchdog_period', 0.02, 'Period of the staleness check', tunable=False, lo=0.005,
       hi=1.0, unit='s'),
    _p('diagnostics_period', 1.0, 'Period of /diagnostics messages', tunable=False, lo=0.05,
       hi=60.0, unit='s'),
    # One thread keeps the other cores free for DDS, the executor and the camera: on a 2-core
    # CPU it took the node's frame -> twist p99 from 235 to 69 ms (README, "What a robot gets
    # by default").
    _p('torch_threads', 1, 'CPU threads of the engine\'s torch operations in this process (0 = '
       'torch\'s default, one per core)', tunable=False, lo=0, hi=1024),
    # --- recording (draft-head training data) ------------------------------------------------
    _p('record_dir', '', 'Record the frames the engine acts on, with their instruction, as a '
       'ROS 2 bag in this folder (for `vla-spec train-draft --bag`); empty = off',
       tunable=False),
    _p('record_period', 0.5, 'At most one recorded frame per robot per this many seconds',
       tunable=False, lo=0.0, hi=3600.0, unit='s'),
    _p('record_max_mb', 2048, 'Stop recording when the bag would exceed this size',
       tunable=False, lo=1, hi=1000000, unit='MB'),
    _p('record_split_s', 10.0, 'Close the bag\'s current file and start the next after this '
       'many seconds, so a killed node loses at most the last ones (0 = one file, readable '
       'only after a clean shutdown)', tunable=False, lo=0.0, hi=86400.0, unit='s'),
)

# Parameters a robot of a multi-robot node may set for itself as `<robot>.<name>`; each starts
# from the node-wide value at start-up. The rest (model, engine, periods) are node-wide.
ROBOT_PARAMETERS = (
    'instruction', 'unnorm_key', 'enabled', 'frame_id', 'control_period', 'linear_scale',
    'angular_scale', 'max_linear_speed', 'max_angular_speed', 'gripper_binarize',
    'gripper_threshold', 'gripper_invert', 'gripper_open_position', 'gripper_closed_position',
    'gripper_action_name', 'gripper_max_effort', 'chunk_blend', 'chunk_ensemble_decay',
    'invalid_chunk',
    'max_action_age', 'stamp_source', 'num_halt_messages', 'gripper_action_type',
    'gripper_joint_name', 'servo_node', 'servo_command_type', 'servo_pause_on_hold',
    'pose_targets', 'tool_pose_topic', 'tool_frame', 'pose_delta_frame', 'image_sync_tolerance',
    'state_joint_names', 'max_state_age', 'joint_names', 'joint_max_velocity',
    'joint_position_min', 'joint_position_max')


# Engine parameters (from EngineConfig) first, then the node's own.
PARAMETERS: tuple[ParameterSpec, ...] = engine_parameter_specs() + NODE_PARAMETERS
PARAMETERS_BY_NAME = {spec.name: spec for spec in PARAMETERS}
_OPTIONAL_ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig)
                                if f.default is None and f.name in PARAMETERS_BY_NAME)
TUNABLE_PARAMETERS = tuple(s.name for s in PARAMETERS if s.is_tunable)
LOAD_TIME_PARAMETERS = tuple(s.name for s in PARAMETERS if not s.is_tunable)


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


def robot_parameter_name(robot: str, name: str) -> str:
    return f'{robot}.{name}'


def robot_settings(node: NodeSettings, values: Mapping[str, Any]) -> dict[str, NodeSettings]:
    """{robot name: its NodeSettings}: the node-wide settings overlaid with the robot's own
    `<robot>.<name>` values present in `values`. A single-robot node gives {'': node}."""
    if not node.robots:
        return {'': node}
    out = {}
    for robot in node.robots:
        changes = {name: values[robot_parameter_name(robot, name)] for name in ROBOT_PARAMETERS
                   if robot_parameter_name(robot, name) in values}
        try:
            out[robot] = dataclasses.replace(node, **changes)
        except ValueError as exc:
            raise ValueError(f'{robot}.{exc}') from None
    _check_unshared(out)
    return out


# What one robot's arm alone may be connected to: a MoveIt Servo (a robot's hold pauses it),
# the tool pose its targets start from, the gripper its goals move.
UNSHARED_CONNECTIONS = {
    'servo_node': 'one MoveIt Servo moves one arm, and a hold of either robot would pause it',
    'tool_pose_topic': 'pose targets would start from the other arm\'s tool',
    'gripper_action_name': 'either robot\'s goals would move the one gripper',
}


def _named(robot: str, name: str, value) -> str:
    return f'{robot}.{name}: {value!r}'


def check_unshared(values: Mapping[str, Mapping[str, Any]], where=_named) -> None:
    """ValueError when two robots name the same non-empty Servo, tool pose topic or gripper
    action (a node-wide value or a launch argument given to several robots, a copied block).
    `values`: {robot: {parameter: value}} (missing parameters count as empty);
    `where(robot, name, value)` starts the message. The node checks its settings so, the
    fleet file its values before anything starts."""
    for name, why in UNSHARED_CONNECTIONS.items():
        owner = {}
        for robot, own in values.items():
            value = own.get(name)
            if value and value in owner:
                raise ValueError(f'{where(robot, name, value)} is also {owner[value]}\'s: '
                                 f'{why}; give each robot its own {name}')
            owner.setdefault(value, robot)


def _check_unshared(robots: Mapping[str, NodeSettings]) -> None:
    """`check_unshared` over the robots' settings, and no two robots with pose targets
    reading their tool pose from one TF transform."""
    check_unshared({robot: {name: getattr(settings, name) for name in UNSHARED_CONNECTIONS}
                    for robot, settings in robots.items()})
    owner = {}          # pose targets from TF: one transform frame_id -> tool_frame per arm
    for robot, settings in robots.items():
        if not settings.pose_targets or settings.tool_pose_topic:
            continue
        pair = (settings.frame_id, settings.tool_frame)
        if pair in owner:
            raise ValueError(f'{robot}.tool_frame: TF {pair[0]} -> {pair[1]} is also '
                             f'{owner[pair]}\'s tool pose: pose targets would start from the '
                             'other arm\'s tool; give each robot its own frame_id or tool_frame')
        owner[pair] = robot


def default_values() -> dict[str, Any]:
    return {spec.name: spec.default for spec in PARAMETERS}


def settings_from_parameters(values: Mapping[str, Any]) -> tuple[EngineConfig, NodeSettings]:
    """The one mapping: parameter values -> (EngineConfig, NodeSettings).

    `values` may omit parameters (their defaults apply); unknown names raise ValueError.
    Integers given for float parameters are accepted (YAML `1` for `1.0`).
    """
    per_robot = {robot_parameter_name(r, n) for r in values.get('robots') or ()
                 for n in ROBOT_PARAMETERS}
    unknown = sorted(set(values) - set(PARAMETERS_BY_NAME) - per_robot)
    if unknown:
        raise ValueError(f'unknown parameters {unknown}; known: {sorted(PARAMETERS_BY_NAME)}')
    merged = default_values()
    merged.update((k, v) for k, v in values.items() if k in PARAMETERS_BY_NAME)
    engine, node = {}, {}
    for spec in PARAMETERS:
        value = _check_value(spec, merged[spec.name])
        (engine if spec.target == 'engine' else node)[spec.name] = value
    for name in _OPTIONAL_ENGINE_FIELDS:      # '' stands for None in a string parameter
        engine[name] = engine[name] or None
    engine['max_streams'] = max(1, len(node['robots']))     # one engine stream per robot
    return EngineConfig.from_dict(engine), NodeSettings(**node)


@dataclass(frozen=True)
class Configuration:
    """Everything the parameters decide, as one object: the engine's config, the node-wide
    settings and each robot's own (`robot_settings`; {'': node} for a single robot)."""

    engine: EngineConfig
    node: NodeSettings
    robots: Mapping[str, NodeSettings]


def configuration_from_parameters(values: Mapping[str, Any]) -> Configuration:
    """The node's configuration from its parameter values (`settings_from_parameters`, then
    each robot's `<robot>.<name>` overlay); ValueError naming the first bad parameter."""
    engine, node = settings_from_parameters(values)
    return Configuration(engine, node, robot_settings(node, values))


def default_node_settings() -> NodeSettings:
    return settings_from_parameters({})[1]


def load_time_refusal(name: str) -> str:
    """The reason given when a load-time parameter is set at runtime."""
    return (f'{name} is a load-time parameter: the node reads it once, at start-up; set it '
            'in the params file or as a launch argument and restart the node')


def change_refusal(name: str, value: Any, is_deletion: bool, current: Mapping[str, Any],
                   robots: tuple) -> str | None:
    """Why one parameter change is refused whatever the node's state (plain, managed and
    unconfigured alike), or None: a deletion (`ros2 param delete`: list parameters are
    dynamically typed, so rclpy would undeclare one; a deleted joint_max_velocity read as no
    limit, and no `set` could bring it back), and, on a node serving `robots`, a node-wide
    value of a robot's own parameter (set, it was accepted and then ignored)."""
    if is_deletion:
        return (f'{name}: the parameters of this node cannot be deleted (it would read the '
                'parameter as unset and the name could not be set again); set [] or \'\' '
                'to clear a list or a text')
    if robots and name in ROBOT_PARAMETERS and value != current.get(name):
        return (f'{name}: this node serves robots {list(robots)}; set <robot>.{name} (the '
                'node-wide value is only their default at start-up)')
    return None


def tunable_engine_changes(old: EngineConfig, new: EngineConfig) -> dict[str, Any]:
    """Engine tunables whose values differ, for `Engine.set_tunables(**changes)`."""
    return {name: getattr(new, name) for name in TUNABLE_ENGINE_FIELDS
            if getattr(old, name) != getattr(new, name)}


def describe_range(spec: ParameterSpec) -> str:
    """Human-readable constraints, shared by the descriptor, README table and YAML comments."""
    parts = []
    if spec.choices:
        parts.append('one of ' + ', '.join(str(c) for c in spec.choices))
    if spec.min_value is not None:
        unit = f' {spec.unit}' if spec.unit else ''
        parts.append(f'[{spec.min_value}, {spec.max_value}]{unit}')
    elif spec.unit:
        parts.append(spec.unit)
    parts.append('tunable' if spec.is_tunable else 'load-time')
    return '; '.join(parts)


def declare_parameters(node) -> dict[str, Any]:
    """Declare every parameter on an rclpy node, then each robot's own (`<robot>.<name>`,
    defaulting to the node-wide value); returns {name: value} after overrides."""
    values = _declare(node, PARAMETERS, {})
    robots = _check_robot_names('robots', values['robots'])
    values['robots'] = list(robots)
    robot_specs = [dataclasses.replace(PARAMETERS_BY_NAME[name],
                                       name=robot_parameter_name(robot, name))
                   for robot in robots for name in ROBOT_PARAMETERS]
    defaults = {spec.name: values[spec.name.split('.', 1)[1]] for spec in robot_specs}
    values.update(_declare(node, robot_specs, defaults))
    return values


def _declare(node, specs, defaults) -> dict[str, Any]:
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
    from rclpy.parameter import Parameter

    declared = []
    for spec in specs:
        descriptor = ParameterDescriptor(description=spec.description,
                                         additional_constraints=describe_range(spec))
        default = defaults.get(spec.name, spec.default)
        if isinstance(spec.default, float) and spec.min_value is not None:
            descriptor.floating_point_range = [FloatingPointRange(
                from_value=float(spec.min_value), to_value=float(spec.max_value), step=0.0)]
        elif (isinstance(spec.default, int) and not isinstance(spec.default, bool)
              and spec.min_value is not None):
            descriptor.integer_range = [IntegerRange(
                from_value=int(spec.min_value), to_value=int(spec.max_value), step=1)]
        if isinstance(spec.default, list):
            # rclpy types an empty list as a byte array; dynamic typing lets an override give
            # the string array (checked by settings_from_parameters).
            descriptor.dynamic_typing = True
        declared.append((spec.name, default, descriptor))
    params = node.declare_parameters('', declared)
    # An empty list is typed here: rclpy types [] as a byte array, and an empty YAML list in
    # a params file reaches the node unset, which `ros2 param get` calls "not set" and `ros2
    # param dump` writes as null (loaded back as the text 'None', refused). A typed empty
    # array dumps as [] and loads back.
    empty = [Parameter(p.name, Parameter.Type.DOUBLE_ARRAY if spec.items == 'float'
                       else Parameter.Type.STRING_ARRAY, [])
             for spec, p in zip(specs, params)
             if isinstance(spec.default, list) and not p.value]
    if empty:
        node.set_parameters(empty)
    values = {p.name: p.value for p in params}
    values.update((p.name, []) for p in empty)
    return values


__all__ = ['check_unshared',
           'ParameterSpec', 'PARAMETERS', 'PARAMETERS_BY_NAME', 'TUNABLE_PARAMETERS',
           'LOAD_TIME_PARAMETERS', 'ENGINE_FIELDS_NOT_EXPOSED', 'NodeSettings',
           'settings_from_parameters', 'Configuration', 'configuration_from_parameters',
           'default_values', 'default_node_settings',
           'load_time_refusal', 'tunable_engine_changes', 'describe_range',
           'declare_parameters', 'ROBOT_PARAMETERS', 'robot_parameter_name',
           'robot_settings']
