"""`colcon build` of this package into a fresh workspace, then the installed entry point.

The repository is copied to `<tmp>/src/vla_spec_ros` (so nothing is written into the source
tree) and built with colcon (colcon-core + colcon-ros: the `ros.ament_python` build type),
once per test process: launch_util.colcon_workspace, shared with the `ros2 launch` tests.
The install space must hold what a ROS 2 user expects: the ament index marker, package.xml,
launch files, YAML configs and the node executables in `lib/vla_spec_ros` (setup.cfg's
script-dir entries). The node is then started from the install space, with its environment
taken from colcon's generated `install/setup.sh`, and queried over DDS in an isolated domain.
"""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

import launch_util
from launch_util import NodeProcess

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = launch_util.PACKAGE
HAS_COLCON = launch_util.has_colcon()
HAS_RCLPY = all(importlib.util.find_spec(m) is not None
                for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
DOMAIN_ID = 211 + (os.getpid() % 10)    # other tests: 11..210
TIMEOUT = 60.0
EXECUTABLES = ('vla-spec', 'vla-spec-node', 'vla-spec-lifecycle-node', 'vla-spec-sim-bridge')

needs_colcon = pytest.mark.skipif(
    not HAS_COLCON, reason='colcon is not installed (colcon-core, colcon-ros, '
    'colcon-python-setup-py: pip install -e ".[test]")')


@pytest.fixture(scope='module')
def workspace():
    """(workspace, install prefix of the package), built once per test process."""
    return launch_util.colcon_workspace()


install_env = launch_util.install_env


def test_package_xml_declares_the_interfaces_the_code_imports():
    package_module = pytest.importorskip('catkin_pkg.package', reason='catkin_pkg (colcon-ros)')
    package = package_module.parse_package(str(ROOT / 'package.xml'))
    package.validate()
    assert package.name == PACKAGE and package.get_build_type() == 'ament_python'
    declared = {d.name for d in package.exec_depends}
    imported = set()
    for path in [*(ROOT / PACKAGE).rglob('*.py'), *(ROOT / 'launch').glob('*.py')]:
        imported |= set(re.findall(r'^\s*from (\w+)\.(?:msg|srv|action) import',
                                   path.read_text(), re.MULTILINE))
    assert {'sensor_msgs', 'geometry_msgs', 'std_msgs', 'std_srvs', 'diagnostic_msgs',
            'control_msgs'} <= imported
    assert imported <= declared, f'imported but not in package.xml: {imported - declared}'
    assert {'rclpy', 'lifecycle_msgs', 'launch', 'launch_ros'} <= declared


@needs_colcon
def test_install_space_layout(workspace):
    ws, prefix = workspace
    share = prefix / 'share' / PACKAGE
    assert (prefix / 'share' / 'ament_index' / 'resource_index' / 'packages' / PACKAGE).is_file()
    assert (share / 'package.xml').read_text() == (ROOT / 'package.xml').read_text()
    # colcon-ros built it as ros.ament_python (that build type adds the ament prefix hook).
    assert (share / 'hook' / 'ament_prefix_path.dsv').is_file()
    launch_files = sorted(p.name for p in (share / 'launch').glob('*.launch.py'))
    assert launch_files == sorted(p.name for p in (ROOT / 'launch').glob('*.launch.py'))
    assert 'robot.launch.py' in launch_files
    configs = sorted(p.name for p in (share / 'config').glob('*.yaml'))
    assert configs == sorted(p.name for p in (ROOT / 'config').glob('*.yaml'))
    assert 'robot.yaml' in configs
    # setup.cfg's [develop]/[install] entries put the executables where `ros2 run` and
    # launch_ros look for them.
    for name in EXECUTABLES:
        path = prefix / 'lib' / PACKAGE / name
        assert path.is_file() and os.access(path, os.X_OK), path
    assert not (prefix / 'bin').exists()
    # The Python package, with the shipped model and the kernels folder.
    site = prefix / 'lib' / f'python{sys.version_info[0]}.{sys.version_info[1]}' / 'site-packages'
    assert (site / PACKAGE / 'ros' / 'node.py').is_file()
    assert (site / PACKAGE / 'kernels' / '__init__.py').is_file()
    assert (site / PACKAGE / 'assets' / 'metaworld-demo' / 'config.json').is_file()


@needs_colcon
def test_install_environment_resolves_to_the_install_space(workspace):
    ws, prefix = workspace
    env = install_env(ws)
    code = ('import vla_spec_ros; from ament_index_python.packages import '
            'get_package_share_directory as share; '
            'print(vla_spec_ros.__file__); print(share("vla_spec_ros"))')
    result = subprocess.run([sys.executable, '-c', code], cwd=str(ws), env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    module_file, share_dir = result.stdout.split()
    assert pathlib.Path(module_file).is_relative_to(prefix), module_file
    assert pathlib.Path(share_dir) == prefix / 'share' / PACKAGE


@pytest.fixture(scope='module')
def probe():
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    with pytest.MonkeyPatch.context() as patch:     # discovery on this host only, as the node
        patch.setenv('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=DOMAIN_ID)
        node = Node('colcon_probe', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    yield node, executor
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


@needs_colcon
@pytest.mark.skipif(not (HAS_RCLPY and HAS_TORCH),
                    reason='starting the node needs rclpy, the ROS message wheels and torch')
def test_installed_node_entry_point_comes_up(workspace, probe):
    from rclpy.parameter import parameter_value_to_python
    from rclpy.parameter_client import AsyncParameterClient

    ws, prefix = workspace
    node, executor = probe
    env = install_env(ws)
    env.update(ROS_DOMAIN_ID=str(DOMAIN_ID), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST',
               PYTHONUNBUFFERED='1')
    argv = [str(prefix / 'lib' / PACKAGE / 'vla-spec-node'), '--ros-args',
            '-p', 'model_path:=tiny', '-p', 'restrict_to_action_tokens:=true',
            '-p', 'unnorm_key:=bridge_orig', '-p', 'frame_id:=tool0',
            '-p', 'control_period:=0.1']
    started = time.monotonic()
    with NodeProcess(argv, cwd=str(ws), env=env) as node_process:
        client = AsyncParameterClient(node, '/vla_spec')
        assert client.wait_for_services(timeout_sec=TIMEOUT), 'installed node did not come up'
        names = ['model_path', 'restrict_to_action_tokens', 'unnorm_key', 'frame_id',
                 'control_period', 'enabled']
        future = client.get_parameters(names)
        executor.spin_until_future_complete(future, timeout_sec=TIMEOUT)
        assert future.done(), 'no parameter response'
        got = {n: parameter_value_to_python(v) for n, v in zip(names, future.result().values)}
        assert got == {'model_path': 'tiny', 'restrict_to_action_tokens': True,
                       'unnorm_key': 'bridge_orig', 'frame_id': 'tool0',
                       'control_period': 0.1, 'enabled': False}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and node.count_publishers('/vla_spec/twist') < 1:
            time.sleep(0.05)
        assert node.count_publishers('/vla_spec/twist') >= 1
        print(f'installed node up in {time.monotonic() - started:.1f} s')
    output = node_process.output
    assert 'ready' in output, output
