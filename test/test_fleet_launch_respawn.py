"""launch/fleet.launch.py through ROS 2's launch system: an engine refused at start-up is
started again at most `respawn_max_retries` times, then launch ends; the refusal names the
engine. And the node's one-line start-up error names the node as the command line renames it.

The launch runs through launch's Python API (what `ros2 launch` calls), without a colcon build:
launch_ros finds `vla-spec-node` through the ament index, so the test writes a prefix holding
the package's index marker and a `lib/vla_spec_ros/vla-spec-node` that runs this tree's node
module (what colcon installs). The engines exit before they join the ROS graph.
"""
import importlib.util
import os
import shlex
import subprocess
import sys

import pytest

import launch_util

NEEDED = ('launch', 'launch_ros', 'ament_index_python', 'rclpy', 'torch')
HAS_LAUNCH = all(importlib.util.find_spec(m) is not None for m in NEEDED)
DOMAIN_ID = 100 + (os.getpid() % 61)
TIMEOUT = 120.0
# Runs fleet.launch.py as `ros2 launch <file> fleet_file:=<file>` does; exits with launch's code.
LAUNCH_SCRIPT = '''
import sys
from launch import LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource

service = LaunchService()
service.include_launch_description(IncludeLaunchDescription(
    PythonLaunchDescriptionSource(sys.argv[1]), launch_arguments=[('fleet_file', sys.argv[2])]))
sys.exit(service.run())
'''


def package_prefix(tmp_path):
    """An install prefix where launch_ros finds vla_spec_ros' `vla-spec-node`: this tree's
    node module, run by this interpreter."""
    prefix = tmp_path / 'install'
    marker = prefix / 'share' / 'ament_index' / 'resource_index' / 'packages' / 'vla_spec_ros'
    marker.parent.mkdir(parents=True)
    marker.write_text('')
    executable = prefix / 'lib' / 'vla_spec_ros' / 'vla-spec-node'
    executable.parent.mkdir(parents=True)
    executable.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m '
                          'vla_spec_ros.ros.node "$@"\n')
    executable.chmod(0o755)
    return prefix


@pytest.mark.skipif(not HAS_LAUNCH, reason=f'needs {", ".join(NEEDED)}')
def test_an_engine_refused_at_start_up_is_not_restarted_for_ever(tmp_path):
    """Before, every engine had `respawn: true` without a limit: an engine the node refuses
    at start-up (here two image_transports for one camera; in the field an unnorm_key the
    checkpoint does not have, known only once the model is loaded) was started again every
    respawn_delay for as long as launch ran, reloading its model each time, and the refusal
    was signed `vla_spec`, not the engine."""
    fleet_file = tmp_path / 'fleet.yaml'
    fleet_file.write_text(
        'fleet:\n  respawn_delay: 0.2\n  respawn_max_retries: 2\n'
        '  parameters: {model_path: metaworld-demo, torch_threads: 1}\n'
        '  engines:\n    e0: {device: cpu, robots: [arm0],\n'
        '         parameters: {image_transports: [raw, raw]}}\n')
    env = launch_util.child_env(DOMAIN_ID, AMENT_PREFIX_PATH=str(package_prefix(tmp_path)))
    launch_file = launch_util.ROOT / 'launch' / 'fleet.launch.py'
    result = subprocess.run([sys.executable, '-c', LAUNCH_SCRIPT, str(launch_file),
                             str(fleet_file)], env=env, cwd=str(tmp_path),
                            capture_output=True, text=True, timeout=TIMEOUT)
    output = result.stdout + result.stderr
    # The first start and two restarts, then launch ends by itself (no timeout above).
    assert output.count('process started') == 3, output
    assert output.count('process has died') == 3 and 'exit code 1' in output, output
    assert output.count('e0: image_transports: 2 values for 1 image slots') == 3, output
    assert 'vla_spec: ' not in output, output


@pytest.mark.parametrize('argv, name', [
    (['--ros-args', '-r', '__node:=e0', '--params-file', 'f.yaml'], 'e0'),
    (['--ros-args', '--remap', 'vla_spec:__node:=left', '-r', '__node:=right'], 'left'),
    (['--ros-args', '-r', 'other:__node:=left', '-r', '__ns:=/cell'], 'vla_spec'),
    (['--ros-args', '-p', 'mode:=ar', '--', '-r', '__node:=not_ros'], 'vla_spec'),
    (['-r', '__node:=not_ros_either'], 'vla_spec'),
    ([], 'vla_spec'),
])
def test_the_start_up_error_names_the_node_as_the_command_line_renames_it(argv, name):
    from vla_spec_ros.ros.node import node_name_from_args

    assert node_name_from_args(['vla-spec-node'] + argv, 'vla_spec') == name
