"""Launch the vla_spec node for a real robot (MoveIt Servo + a ros2_control gripper).

    ros2 launch vla_spec_ros robot.launch.py model_path:=/models/openvla-7b-libero-goal \\
        unnorm_key:=libero_goal

runs the default configuration (config/robot.yaml): pipelined speculation drafting each
camera's previous action, exact (AR's tokens), no draft model needed; `draft_path:=<folder>`
uses a trained EAGLE head instead, `mode:=ar` the plain reference. Without a checkpoint:

    ros2 launch vla_spec_ros robot.launch.py model_path:=tiny unnorm_key:=bridge_orig \\
        restrict_to_action_tokens:=true

(random weights: only greedy decoding over the action tokens gives them valid actions).

Defaults plug into MoveIt Servo (`/servo_node/delta_twist_cmds`, TwistStamped) and a
forward command controller for the gripper (`/gripper_controller/commands`,
Float64MultiArray); `servo_node:=/servo_node` makes the node keep Servo's contract
(command type, pause on a hold, timeout check) and `pose_target_topic` /
`pose_trajectory_topic` route the absolute targets of `pose_targets: true` (docs/robot.md).
Empty model / draft / unnorm_key / mode / restrict_to_action_tokens / servo_node /
tool_pose_topic arguments keep the values of `params_file` (config/robot.yaml by default).
Several robots on one node: `params_file:=<share>/config/two_robots.yaml` (its own `robots`
list and per-robot values); the topic arguments then do not apply (the robots' topics are
`<robot>/image`, `<robot>/twist`, ...: the launch says so), remap those or use fleet.launch.py.
`lifecycle:=true` starts the managed node instead.

`launch` and `launch_ros` are imported inside `generate_launch_description` only, so this
file also imports where only rclpy is installed; `node_options` is what the launch action is
built from, and the tests turn the same options into
`vla-spec-node --ros-args --params-file ... -r ...` there.
"""
import difflib
import os

# Installed: share/vla_spec_ros/{launch,config}/; in the source tree: launch/ and config/.
DEFAULT_PARAMS_FILE = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'config', 'robot.yaml'))

# (name, default, description). Empty strings mean "not overridden".
ARGUMENTS = (
    ('model_path', '', 'Checkpoint folder or preset name; empty = the params_file value'),
    ('draft_path', '', '"previous_action" (the default: no draft model), an EAGLE draft-head '
                       'folder, "checkpoint" or "random"; empty = the params_file value'),
    ('unnorm_key', '', 'Dataset statistics key; empty = the params_file value'),
    ('mode', '', 'ar, pipeline, spec or pipeline_spec (the default in config/robot.yaml); '
                 'empty = the params_file value'),
    ('restrict_to_action_tokens', '', 'true: greedy over the action tokens only (a random-'
     'weight preset such as tiny needs it, else its actions are invalid); empty = the '
     'params_file value'),
    ('params_file', DEFAULT_PARAMS_FILE, 'YAML parameter file of the node'),
    ('namespace', '', 'Namespace of the node (one per robot)'),
    ('node_name', 'vla_spec', 'Name of the node'),
    ('camera_topic', '/camera/image_raw', 'sensor_msgs/Image input (image_transport: raw)'),
    ('camera_compressed_topic', '/camera/image_raw/compressed',
     'sensor_msgs/CompressedImage input (image_transport: compressed)'),
    ('instruction_topic', '', 'std_msgs/String instruction input; empty = ~/instruction'),
    ('twist_topic', '/servo_node/delta_twist_cmds', 'TwistStamped output (MoveIt Servo)'),
    ('servo_node', '', 'MoveIt Servo node whose contract the node keeps (e.g. /servo_node); '
                       'empty = the params_file value'),
    ('tool_pose_topic', '', 'PoseStamped tool pose for pose_targets; empty = the params_file '
                            'value'),
    ('pose_target_topic', '/servo_node/pose_target_cmds',
     'PoseStamped absolute target output (pose_targets: true; MoveIt Servo pose mode)'),
    ('pose_trajectory_topic', '', 'MultiDOFJointTrajectory of absolute poses (pose_targets: '
                                  'true, chunked models; a Cartesian trajectory controller); '
                                  'empty = ~/pose_trajectory'),
    ('gripper_topic', '/gripper_controller/commands',
     'Float64MultiArray gripper output (forward command controller)'),
    ('joint_states_topic', '/joint_states', 'sensor_msgs/JointState state input (state_input: '
                                            'joint_state; joint_state_broadcaster\'s topic)'),
    ('state_topic', '', 'Float64MultiArray state input (state_input: array); empty = ~/state'),
    ('joint_jog_topic', '/servo_node/delta_joint_cmds',
     'control_msgs/JointJog output (action_space: joint_velocity; MoveIt Servo)'),
    ('joint_trajectory_topic', '', 'trajectory_msgs/JointTrajectory output (action_space: '
     'joint_position; e.g. /joint_trajectory_controller/joint_trajectory); empty = '
     '~/joint_trajectory'),
    ('lifecycle', 'false', 'true: the managed node (starts unconfigured; `ros2 lifecycle set '
     '<node> configure` loads the model, `activate` starts acting)'),
)

# launch argument -> the node's own topic name it remaps.
REMAPPINGS = (
    ('camera_topic', '~/image'),
    ('camera_compressed_topic', '~/image/compressed'),
    ('instruction_topic', '~/instruction'),
    ('twist_topic', '~/twist'),
    ('pose_target_topic', '~/pose_target'),
    ('pose_trajectory_topic', '~/pose_trajectory'),
    ('gripper_topic', '~/gripper'),
    ('joint_states_topic', '~/joint_states'),
    ('state_topic', '~/state'),
    ('joint_jog_topic', '~/joint_jog'),
    ('joint_trajectory_topic', '~/joint_trajectory'),
)

# Launch arguments that override a node parameter when non-empty.
PARAMETER_ARGUMENTS = ('model_path', 'draft_path', 'unnorm_key', 'mode',
                       'restrict_to_action_tokens', 'servo_node', 'tool_pose_topic')
# Of those, the boolean parameters: launch_ros hands a string value to the node as a string,
# which the node refuses for a bool, so 'true' / 'false' become booleans here.
BOOLEAN_ARGUMENTS = ('restrict_to_action_tokens',)


def _parameter_value(name: str, text: str):
    if name not in BOOLEAN_ARGUMENTS:
        return text
    flag = text.strip().lower()
    if flag not in ('true', 'false'):
        raise ValueError(f'{name}: expected true or false, got {text!r}')
    return flag == 'true'


def params_file_robots(path: str) -> list:
    """The `robots` a parameter file gives its node (any node key's ros__parameters), or
    [] (none, or a file that cannot be read here: the node reports that itself)."""
    try:
        import yaml
        with open(path, encoding='utf-8') as handle:
            document = yaml.safe_load(handle) or {}
    except (ImportError, OSError, ValueError):
        return []
    for section in document.values() if isinstance(document, dict) else ():
        robots = (section or {}).get('ros__parameters', {}).get('robots') \
            if isinstance(section, dict) else None
        if robots:
            return list(robots)
    return []


def node_options(values: dict) -> dict:
    """Argument values (strings) -> name, namespace, parameters and remappings of the node.
    A params_file serving several robots gets no remapping: the topic arguments name the
    single robot's topics (~/twist, ...), which such a node does not have (launch_notes)."""
    overrides = {name: _parameter_value(name, values[name]) for name in PARAMETER_ARGUMENTS
                 if values.get(name)}
    parameters = [values['params_file']] + ([overrides] if overrides else [])
    remappings = [] if params_file_robots(values['params_file']) else [
        (own, values[arg]) for arg, own in REMAPPINGS if values.get(arg)]
    return {'name': values['node_name'], 'namespace': values['namespace'],
            'parameters': parameters, 'remappings': remappings}


def launch_notes(values: dict) -> list:
    """What the launch says before the node starts: with a params_file serving several
    robots, that the topic arguments do not apply and which topics the robots have."""
    robots = params_file_robots(values['params_file'])
    if not robots:
        return []
    topics = ', '.join(f'{r}/image, {r}/twist' for r in robots)
    return [f'params_file serves robots {robots}: the topic arguments ('
            + ', '.join(arg for arg, _ in REMAPPINGS) + f') do not apply; its topics are '
            f'{topics}, ... (relative to the node\'s namespace): remap those (--ros-args -r '
            f'{robots[0]}/twist:=...), or use fleet.launch.py']


def check_params_file(path: str) -> None:
    """ValueError unless `path` is a file: launch_ros only warns about a missing one, and the
    node would then run with every default (the embedded model included)."""
    if not os.path.isfile(path):
        raise ValueError(f'params_file: {path!r} is not a file')


def misspelt_argument_notes(configurations: dict) -> list:
    """A warning for each launch configuration that is not an argument of this file but
    nearly spells one (`model_pth:=...`): launch accepts any name, so a typo would silently
    leave the parameter at its params_file value. Names far from every argument are left
    alone: a launch file that includes this one may have arguments of its own."""
    names = [name for name, _, _ in ARGUMENTS]
    notes = []
    for given in sorted(set(configurations) - set(names)):
        close = difflib.get_close_matches(given, names, n=1, cutoff=0.75)
        if close:
            notes.append(f'{given}:={configurations[given]} is not an argument of '
                         f'robot.launch.py and is ignored; did you mean {close[0]}? '
                         '(ros2 launch vla_spec_ros robot.launch.py --show-args)')
    return notes


def executable(values: dict) -> str:
    """The plain node, or the managed (lifecycle) one when `lifecycle` is true."""
    flag = values.get('lifecycle', 'false').strip().lower()
    if flag not in ('true', 'false'):
        raise ValueError(f'lifecycle: expected true or false, got {values["lifecycle"]!r}')
    return 'vla-spec-lifecycle-node' if flag == 'true' else 'vla-spec-node'


def _launch_node(context, *args, **kwargs):
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from launch.actions import LogInfo

    from launch.logging import get_logger

    from vla_spec_ros.ros.parent_exit import child_env

    for note in misspelt_argument_notes(context.launch_configurations):
        get_logger('robot.launch.py').warning(note)
    values = {name: LaunchConfiguration(name).perform(context) for name, _, _ in ARGUMENTS}
    check_params_file(values['params_file'])
    options = node_options(values)
    # The node stops with this launch process even when it is killed or sent SIGTERM (launch
    # then leaves its nodes running): vla_spec_ros/ros/parent_exit.py.
    return [LogInfo(msg=note) for note in launch_notes(values)] + [
        Node(package='vla_spec_ros', executable=executable(values), output='screen',
             emulate_tty=True, additional_env=child_env(), **options)]


def generate_launch_description():
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in ARGUMENTS]
    return LaunchDescription(declared + [OpaqueFunction(function=_launch_node)])
