"""The node entry points on bad command lines (run as processes, as a user types them):
`--help` prints the parameters and exits 0 (before, every entry point ignored it and started:
the node loaded its default model and served); arguments ROS cannot parse and a refused
parameter of the managed node end with a one-line error and exit code 1 (before: an RCLError
traceback, and an AttributeError traceback after the managed node's own message)."""
import importlib.util
import subprocess
import sys

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'lifecycle_msgs'))
pytestmark = pytest.mark.skipif(not HAS_ROS, reason='needs rclpy and the ROS message wheels')
TIMEOUT_S = 120


def run_module(module, *args):
    return subprocess.run([sys.executable, '-m', module, *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize('module', ['vla_spec_ros.ros.node', 'vla_spec_ros.ros.lifecycle_node'])
def test_help_prints_the_parameters_and_starts_nothing(module):
    done = run_module(module, '--help')
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('usage: vla-spec-') and 'model_path = ' in done.stdout
    assert 'control_period = 0.2  [[0.001, 10.0] s; tunable]' in done.stdout, done.stdout
    assert 'loading' not in done.stdout + done.stderr


def test_the_simulator_bridge_prints_its_usage():
    done = run_module('vla_spec_ros.harness.sim_bridge', '--help')
    assert done.returncode == 0 and done.stdout.startswith('usage: vla-spec-sim-bridge')


@pytest.mark.parametrize('module, args, words', [
    ('vla_spec_ros.ros.node', ['--ros-args', '-p', 'mode=ar'], "parameter override rule"),
    ('vla_spec_ros.ros.node', ['--ros-args', '--params-file', '/no/such/file.yaml'],
     'no/such/file.yaml'),
    ('vla_spec_ros.ros.lifecycle_node', ['--ros-args', '-p', 'moed:=ar'],
     "unknown parameters ['moed']"),
])
def test_a_bad_command_line_ends_with_one_line_and_exit_code_1(module, args, words):
    done = run_module(module, *args)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert words in done.stderr and 'Traceback' not in done.stderr, done.stderr


@pytest.mark.parametrize('key, name, applies', [
    ('/**', '/vla_spec', True), ('vla_spec', '/vla_spec', True), ('/vla_spec', '/vla_spec', True),
    ('vla_spec_node', '/vla_spec', False), ('/arm/vla_spec', '/arm/vla_spec', True),
    ('/arm/vla_spec', '/vla_spec', False), ('/**/vla_spec', '/vla_spec', True),
    ('/**/vla_spec', '/a/b/vla_spec', True), ('/*/vla_spec', '/a/vla_spec', True),
    ('/*/vla_spec', '/vla_spec', False),
])
def test_a_params_file_key_applies_to_the_nodes_rcl_applies_it_to(key, name, applies):
    from vla_spec_ros.ros.params_files import key_matches
    assert key_matches(key, name) is applies


def test_a_params_file_naming_another_node_is_reported(tmp_path):
    """Its values were silently not applied (rcl matches sections by node name), so the node
    ran its default model; now it says so, naming the file, its sections and its own name."""
    wrong = tmp_path / 'wrong.yaml'
    wrong.write_text('vla_spec_node:\n  ros__parameters:\n    mode: ar\n')
    right = tmp_path / 'right.yaml'
    right.write_text('/**:\n  ros__parameters:\n    enabled: false\n')
    from vla_spec_ros.ros.params_files import unmatched_params_files
    argv = ['vla-spec-node', '--ros-args', '--params-file', str(right),
            '--params-file', str(wrong), '-p', 'mode:=ar']
    assert unmatched_params_files(argv, '/vla_spec') == [(str(wrong), ['vla_spec_node'])]
    assert unmatched_params_files(argv[:4], '/vla_spec') == []
