"""The table of the `vla_spec` node's parameters: one `ParameterSpec` per parameter (name,
default, description, range, tunable or load-time), the engine's derived from EngineConfig's
field metadata (config.py `EngineOption`: written once, there), the node's own written below,
and the subsets a robot of a multi-robot node sets for itself (`ROBOT_PARAMETERS`).
params.py maps their values onto the frozen configuration; parameter_declaration.py declares
them on an rclpy node. Pure Python.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vla_spec_ros.config import EngineConfig

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
