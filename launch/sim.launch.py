"""Launch the vla_spec node with the Meta-World simulator bridge (the embedded model's world).

    ros2 launch vla_spec_ros sim.launch.py task_name:=drawer-open episodes:=5 mode:=spec

The bridge publishes the camera and the instruction to the VLA node's private topics and applies
its twist and gripper commands to the simulator; both nodes get the same control period, scales,
speed limits and gripper convention (the bridge inverts exactly what the VLA node applies). The
bridge runs `episodes` seeded episodes of `task_name` and logs each result. `sim_mode:=lockstep`
waits for the action of every frame (deterministic); `realtime` steps at `control_rate_hz`
whether or not an action arrived. `vla-spec demo` runs the same pair in one process.

`image_size` is the side of the bridge's camera images and must be the input size of the
checkpoint in `model_path` (64 for the embedded metaworld-demo model): the VLA node would
otherwise resize every frame, and the model would see images unlike those it was trained on.

Like robot.launch.py, `launch` / `launch_ros` are imported inside `generate_launch_description`
only; `node_options` is what the launch actions are built from, and the tests start the same
options as processes where `launch` is not installed.
"""
import os

DEFAULT_PARAMS_FILE = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'config', 'robot.yaml'))

# (name, default, description).
ARGUMENTS = (
    ('model_path', 'metaworld-demo', 'Checkpoint folder or preset name'),
    ('mode', 'ar', 'ar, pipeline, spec or pipeline_spec'),
    ('relax_threshold', '0', 'Relaxed acceptance threshold r (speculative modes)'),
    ('task_name', 'drawer-open', 'Meta-World task (see vla_spec_ros.sim.metaworld_env.TASKS)'),
    ('episodes', '3', 'Episodes the bridge runs'),
    ('seed', '0', 'Base seed of the episodes'),
    ('sim_mode', 'lockstep', 'lockstep (deterministic) or realtime'),
    ('control_rate_hz', '10.0', 'Control rate: the action period of both nodes'),
    ('max_steps', '150', 'Steps before an episode ends unsuccessfully'),
    ('image_size', '64', 'Camera image side in pixels: must be the checkpoint\'s input size '
     '(64 for metaworld-demo), else the VLA node resizes every frame'),
    ('params_file', DEFAULT_PARAMS_FILE, 'YAML parameter file of the VLA node'),
    ('vla_node_name', 'vla_spec', 'Name of the VLA node'),
)

# Shared by both nodes so that twist/gripper -> action is the exact inverse of the VLA node's
# action -> twist/gripper: unit scales, limits far above any action (clamping would change the
# action), gripper message = the model's gripper value in [0, 1] (1 = open).
SHARED_COMMAND_PARAMETERS = {
    'linear_scale': 1.0, 'angular_scale': 1.0, 'max_linear_speed': 10.0,
    'max_angular_speed': 20.0, 'gripper_open_position': 1.0, 'gripper_closed_position': 0.0,
}
VLA_ONLY_PARAMETERS = {'gripper_binarize': False, 'gripper_invert': False, 'enabled': True}
# Lock-step frames wait for their action; the VLA node must not call them stale meanwhile.
MAX_ACTION_AGE_S = {'lockstep': 60.0, 'realtime': 1.0}


def node_options(values: dict) -> tuple[dict, dict]:
    """Argument values (strings) -> (VLA node options, bridge node options)."""
    rate = float(values['control_rate_hz'])
    if not rate > 0:
        raise ValueError(f'control_rate_hz: must be > 0, got {rate}')
    sim_mode = values['sim_mode']
    if sim_mode not in MAX_ACTION_AGE_S:
        raise ValueError(f'sim_mode: expected one of {sorted(MAX_ACTION_AGE_S)}, got '
                         f'{sim_mode!r}')
    image_size = int(values['image_size'])
    if image_size < 1:
        raise ValueError(f'image_size: must be >= 1, got {image_size}')
    period = 1.0 / rate
    vla_name = values['vla_node_name']
    vla_parameters = dict(SHARED_COMMAND_PARAMETERS, **VLA_ONLY_PARAMETERS,
                          model_path=values['model_path'], mode=values['mode'],
                          relax_threshold=int(values['relax_threshold']),
                          control_period=period, max_action_age=MAX_ACTION_AGE_S[sim_mode])
    bridge_parameters = dict(SHARED_COMMAND_PARAMETERS, control_period=period,
                             control_rate_hz=rate, sim_mode=sim_mode,
                             task_name=values['task_name'], episodes=int(values['episodes']),
                             seed=int(values['seed']), max_steps=int(values['max_steps']),
                             image_size=image_size,
                             command_timeout_s=max(0.5, 3.0 * period))
    vla = {'name': vla_name, 'namespace': '',
           'parameters': [values['params_file'], vla_parameters], 'remappings': []}
    bridge = {'name': 'sim_bridge', 'namespace': '', 'parameters': [bridge_parameters],
              'remappings': [(f'~/{topic}', f'/{vla_name}/{topic}')
                             for topic in ('image', 'instruction', 'twist', 'gripper')]}
    return vla, bridge


def _launch_nodes(context, *args, **kwargs):
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    values = {name: LaunchConfiguration(name).perform(context) for name, _, _ in ARGUMENTS}
    vla, bridge = node_options(values)
    return [Node(package='vla_spec_ros', executable='vla-spec-node', output='screen',
                 emulate_tty=True, **vla),
            Node(package='vla_spec_ros', executable='vla-spec-sim-bridge', output='screen',
                 emulate_tty=True, **bridge)]


def generate_launch_description():
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in ARGUMENTS]
    return LaunchDescription(declared + [OpaqueFunction(function=_launch_nodes)])
