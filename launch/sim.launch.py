"""Launch the vla_spec node with the Meta-World simulator bridge (the embedded model's world).

    ros2 launch vla_spec_ros sim.launch.py task_name:=drawer-open episodes:=5 mode:=spec

The bridge publishes the camera and the instruction to the VLA node's private topics and applies
its twist and gripper commands to the simulator; both nodes get the same control period, scales,
speed limits and gripper convention (the bridge inverts exactly what the VLA node applies). The
bridge runs `episodes` seeded episodes of `task_name` and logs each result; when it exits,
launch stops the VLA node and ends. It renders off-screen, so no display is needed (MUJOCO_GL
picks the back end, osmesa unless set). `sim_mode:=lockstep`
waits for the action of every frame (deterministic), with `action_delay:=d` applying it d
control periods later (delayed lock-step); `realtime` steps at `control_rate_hz` whether or
not an action arrived. `vla-spec demo` runs the same pair in one process.

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
    ('action_delay', '0', 'Lock-step: apply the action of period k\'s frame at period k + '
     'action_delay (delayed lock-step; 0 = plain lock-step)'),
    ('delay_hold', 'previous', 'Delayed lock-step: hold the previous action or zero motion '
     'until an action lands'),
    ('delay_frames', 'every', 'Delayed lock-step: every (each frame answered) or '
     'one_in_flight (a new frame only when the previous answer landed)'),
    ('control_rate_hz', '10.0', 'Control rate: the action period of both nodes'),
    ('max_steps', '150', 'Steps before an episode ends unsuccessfully'),
    ('image_size', '64', 'Camera image side in pixels: must be the checkpoint\'s input size '
     '(64 for metaworld-demo), else the VLA node resizes every frame'),
    ('params_file', DEFAULT_PARAMS_FILE, 'YAML parameter file of the VLA node'),
    ('vla_node_name', 'vla_spec', 'Name of the VLA node'),
)

# The conventions both nodes share live in the package (one source for this file and the
# in-process harness); see bridge_settings.matched_command_parameters.
from vla_spec_ros.sim.bridge_settings import (  # noqa: E402
    SHARED_COMMAND_PARAMETERS, matched_command_parameters)

__all__ = ['ARGUMENTS', 'SHARED_COMMAND_PARAMETERS', 'node_options',
           'generate_launch_description']


def node_options(values: dict) -> tuple[dict, dict]:
    """Argument values (strings) -> (VLA node options, bridge node options)."""
    vla_shared, bridge_shared = matched_command_parameters(float(values['control_rate_hz']),
                                                           values['sim_mode'])
    # Lock-step steps the arm once per answered frame: a chunked model's steps, which the node
    # publishes on its own clock, would not be what the arm executes (refused, with the way out).
    from vla_spec_ros.harness.demo_options import check_lockstep_model
    check_lockstep_model(values['model_path'], values['sim_mode'])
    image_size = int(values['image_size'])
    if image_size < 1:
        raise ValueError(f'image_size: must be >= 1, got {image_size}')
    vla_name = values['vla_node_name']
    vla_parameters = dict(vla_shared, model_path=values['model_path'], mode=values['mode'],
                          relax_threshold=int(values['relax_threshold']))
    bridge_parameters = dict(bridge_shared, task_name=values['task_name'],
                             episodes=int(values['episodes']), seed=int(values['seed']),
                             max_steps=int(values['max_steps']), image_size=image_size,
                             action_delay=int(values['action_delay']),
                             delay_hold=values['delay_hold'],
                             delay_frames=values['delay_frames'])
    vla = {'name': vla_name, 'namespace': '',
           'parameters': [values['params_file'], vla_parameters], 'remappings': []}
    bridge = {'name': 'sim_bridge', 'namespace': '', 'parameters': [bridge_parameters],
              'remappings': [(f'~/{topic}', f'/{vla_name}/{topic}')
                             for topic in ('image', 'instruction', 'twist', 'gripper')]}
    return vla, bridge


def _launch_nodes(context, *args, **kwargs):
    from launch.actions import EmitEvent, RegisterEventHandler
    from launch.event_handlers import OnProcessExit
    from launch.events import Shutdown
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from vla_spec_ros.ros.parent_exit import child_env

    values = {name: LaunchConfiguration(name).perform(context) for name, _, _ in ARGUMENTS}
    vla, bridge = node_options(values)
    bridge_node = Node(package='vla_spec_ros', executable='vla-spec-sim-bridge',
                       output='screen', emulate_tty=True, **bridge)
    # The bridge's episodes are the run: once it exits, launch stops the VLA node and ends.
    done = RegisterEventHandler(OnProcessExit(
        target_action=bridge_node,
        on_exit=[EmitEvent(event=Shutdown(reason='the simulator bridge has exited'))]))
    # The node stops with this launch process even when it is killed or sent SIGTERM
    # (vla_spec_ros/ros/parent_exit.py).
    return [Node(package='vla_spec_ros', executable='vla-spec-node', output='screen',
                 emulate_tty=True, additional_env=child_env(), **vla), bridge_node, done]


def generate_launch_description():
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in ARGUMENTS]
    return LaunchDescription(declared + [OpaqueFunction(function=_launch_nodes)])
