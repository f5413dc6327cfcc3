"""launch/robot.launch.py and config/robot.yaml, and the launch arguments the docs name.

The options the launch file builds are turned into `--ros-args --params-file ... -r ...` for the
node's own entry point (what a user without ROS 2's launch system runs), which is started as a
process and inspected over DDS. The real `ros2 launch` of every launch file, from a colcon
build: test_ros2_cli.py, test_ros2_fleet_launch.py and test_sim_launch.py.
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
from launch_util import NodeProcess, default_values

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'robot.launch.py'
HAS_RCLPY = all(importlib.util.find_spec(m) is not None
                for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
DOMAIN_ID = 51 + (os.getpid() % 40)     # test_ros_node uses 11..50
TIMEOUT = 60.0


def load_launch_module():
    return launch_util.load_launch_module(LAUNCH_FILE.name)


def node_command(options, extra=()):
    """What launch_ros runs for these options, with this tree's node module."""
    return launch_util.ros_args_command('vla_spec_ros.ros.node', options, extra)


def child_env():
    return launch_util.child_env(DOMAIN_ID)


def wait_until(predicate, timeout=TIMEOUT, what='condition'):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f'timed out after {timeout} s waiting for {what}')


# ---- the launch file's options (no launch needed) -------------------------------------------

def test_arguments_and_defaults():
    module = load_launch_module()
    names = {name for name, _, _ in module.ARGUMENTS}
    assert {'model_path', 'draft_path', 'params_file', 'namespace', 'camera_topic',
            'instruction_topic', 'twist_topic', 'gripper_topic'} <= names
    defaults = default_values(module)
    assert defaults['twist_topic'] == '/servo_node/delta_twist_cmds'
    assert defaults['gripper_topic'] == '/gripper_controller/commands'
    assert pathlib.Path(defaults['params_file']) == ROOT / 'config' / 'robot.yaml'
    for _, _, description in module.ARGUMENTS:
        assert description


def test_node_options_overrides_and_remaps():
    module = load_launch_module()
    options = module.node_options(default_values(module))
    assert options['name'] == 'vla_spec' and options['namespace'] == ''
    assert options['parameters'] == [str(ROOT / 'config' / 'robot.yaml')]   # YAML only
    remaps = dict(options['remappings'])
    assert remaps['~/twist'] == '/servo_node/delta_twist_cmds'
    assert remaps['~/gripper'] == '/gripper_controller/commands'
    assert remaps['~/image'] == '/camera/image_raw'
    assert '~/instruction' not in remaps          # empty argument: the node's own topic
    # The joint spaces' topics: the broadcaster's states and Servo's joint jog by default.
    assert remaps['~/joint_states'] == '/joint_states'
    assert remaps['~/joint_jog'] == '/servo_node/delta_joint_cmds'
    assert '~/joint_trajectory' not in remaps and '~/state' not in remaps
    remaps = dict(module.node_options(default_values(
        module, joint_trajectory_topic='/arm_controller/joint_trajectory',
        state_topic='/arm/state'))['remappings'])
    assert remaps['~/joint_trajectory'] == '/arm_controller/joint_trajectory'
    assert remaps['~/state'] == '/arm/state'
    options = module.node_options(default_values(module, model_path='/m', mode='spec',
                                                 namespace='robot1'))
    assert options['parameters'][1] == {'model_path': '/m', 'mode': 'spec'}
    assert options['namespace'] == 'robot1'


# ---- the YAML through the node's own --params-file path ------------------------------------

@pytest.fixture(scope='module')
def probe():
    if not HAS_RCLPY:
        pytest.skip('rclpy and the ROS message wheels are not installed')
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    os.environ['ROS_DOMAIN_ID'] = str(DOMAIN_ID)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    node = Node('launch_probe', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    node.executor_for_tests = executor
    yield node
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def _spin_until(node, future, timeout=TIMEOUT):
    node.executor_for_tests.spin_until_future_complete(future, timeout_sec=timeout)
    assert future.done(), 'no response'
    return future.result()


def test_a_params_file_serving_several_robots_gets_no_single_robot_remaps_and_a_note():
    """robot.launch.py with config/two_robots.yaml: the topic arguments (~/twist -> Servo's
    topic, ...) name topics this node does not have (<robot>/twist, ...). Before, they were
    passed anyway and nothing said so (the twists went to /left_arm/twist, no robot moved);
    now none is passed and the launch says which topics the robots have."""
    module = load_launch_module()
    two = str(ROOT / 'config' / 'two_robots.yaml')
    assert module.params_file_robots(two) == ['left_arm', 'right_arm']
    options = module.node_options(default_values(module, params_file=two))
    assert options['remappings'] == []
    (note,) = module.launch_notes(default_values(module, params_file=two))
    assert "serves robots ['left_arm', 'right_arm']" in note and 'left_arm/twist' in note
    assert 'twist_topic' in note and 'fleet.launch.py' in note
    one = default_values(module)
    assert module.launch_notes(one) == [] and module.node_options(one)['remappings']
    assert module.params_file_robots('/no/such/file.yaml') == []


@pytest.mark.skipif(not HAS_TORCH, reason='the node loads the tiny model (needs torch)')
def test_yaml_loaded_through_the_node_params_file(probe):
    import yaml
    from rcl_interfaces.msg import ParameterType
    from rclpy.parameter import parameter_value_to_python
    from rclpy.parameter_client import AsyncParameterClient

    from vla_spec_ros.ros import params

    module = load_launch_module()
    options = module.node_options(default_values(module))
    with NodeProcess(node_command(options), env=child_env(), cwd=str(ROOT)) as node:
        client = AsyncParameterClient(probe, '/vla_spec')
        assert client.wait_for_services(timeout_sec=TIMEOUT), 'node did not come up'
        names = [spec.name for spec in params.PARAMETERS]
        response = _spin_until(probe, client.get_parameters(names))
        got = {n: parameter_value_to_python(v) for n, v in zip(names, response.values)}
        types = {n: v.type for n, v in zip(names, response.values)}
        # rcl reads an empty YAML list as "not set"; the node sets it to a typed empty array
        # (no robots list, no extra image slots, no joints), so that `ros2 param dump` writes
        # [] (it wrote null, which `ros2 param load` gave back as the text 'None', refused).
        yaml_values = yaml.safe_load((ROOT / 'config' / 'robot.yaml').read_text())
        expected = yaml_values['/**']['ros__parameters']
        # Left unset in the file: the tiny model's family recommends nothing, so the defaults.
        from vla_spec_ros.ros.recommended_settings import LEFT_TO_THE_CHECKPOINT
        expected.update({name: params.PARAMETERS_BY_NAME[name].default
                         for name in LEFT_TO_THE_CHECKPOINT})
        empty = sorted(name for name, value in expected.items() if value == [])
        assert 'robots' in empty and all(got[name] == [] for name in empty), empty
        arrays = {ParameterType.PARAMETER_STRING_ARRAY, ParameterType.PARAMETER_DOUBLE_ARRAY}
        assert all(types[name] in arrays for name in empty), {n: types[n] for n in empty}
        assert types['joint_max_velocity'] == ParameterType.PARAMETER_DOUBLE_ARRAY
        assert got == expected
        # Descriptions and ranges are visible to `ros2 param describe`.
        described = _spin_until(probe, client.describe_parameters(['control_period']))
        descriptor = described.descriptors[0]
        assert 'control_period' in descriptor.description
        assert descriptor.floating_point_range[0].from_value == pytest.approx(0.001)
        # The launch file's remaps: Servo twist, forward-command gripper, camera.
        wait_until(lambda: probe.count_publishers('/servo_node/delta_twist_cmds') >= 1
                   and probe.count_publishers('/gripper_controller/commands') >= 1
                   and probe.count_subscribers('/camera/image_raw') >= 1,
                   what='remapped topics')
    output = node.output
    assert 'ready' in output, output


@pytest.mark.skipif(not HAS_TORCH, reason='the node loads the tiny model (needs torch)')
def test_a_joint_space_robot_gets_its_joint_topics_from_the_launch_arguments(probe, tmp_path):
    """robot.launch.py for a joint-position robot reading /joint_states: before, the launch
    had no argument for the joint topics, so a user of the launch file got ~/joint_states and
    ~/joint_trajectory, which no broadcaster or controller uses, and nothing moved."""
    joints = [f'joint{i}' for i in range(1, 7)]
    extra = tmp_path / 'joints.yaml'
    extra.write_text('/**:\n  ros__parameters:\n    action_space: joint_position\n'
                     f'    joint_names: {joints}\n    state_input: joint_state\n'
                     f'    joint_position_min: {[-3.0] * 6}\n'
                     f'    joint_position_max: {[3.0] * 6}\n')
    module = load_launch_module()
    options = module.node_options(default_values(
        module, node_name='vla_joints',
        joint_trajectory_topic='/arm_controller/joint_trajectory'))
    options['parameters'].append(str(extra))
    with NodeProcess(node_command(options), env=child_env(), cwd=str(ROOT)) as node:
        wait_until(lambda: probe.count_publishers('/arm_controller/joint_trajectory') >= 1
                   and probe.count_subscribers('/joint_states') >= 1,
                   what='the remapped joint topics')
    # (The topics exist before the warm-up ends: the node may be stopped before 'ready'.)
    assert 'Traceback' not in node.output and "loading 'metaworld-demo'" in node.output, \
        node.output


def test_a_misspelt_argument_is_warned_about_and_a_missing_params_file_refused(tmp_path):
    """The review's cases: `model_pth:=tiny` and a params_file that does not exist both
    started the embedded model silently (launch accepts any argument name; launch_ros only
    warns about a missing file and the node then runs every default). A name near one of
    this file's arguments gets a warning naming it; names far from all of them are another
    launch file's (an including one's) and left alone; a missing params_file is refused."""
    module = load_launch_module()
    notes = module.misspelt_argument_notes(
        {'model_pth': 'tiny', 'use_sim_time': 'true', 'robot_ip': '10.0.0.2',
         'model_path': 'metaworld-demo'})
    assert len(notes) == 1 and notes[0].startswith('model_pth:=tiny is not an argument')
    assert 'did you mean model_path?' in notes[0]
    with pytest.raises(ValueError, match="params_file: .*nonexist.yaml' is not a file"):
        module.check_params_file(str(tmp_path / 'nonexist.yaml'))
    with pytest.raises(ValueError, match='is not a file'):
        module.check_params_file(str(tmp_path))
    module.check_params_file(default_values(module)['params_file'])


def test_lifecycle_argument_picks_the_managed_executable():
    module = load_launch_module()
    assert module.executable(default_values(module)) == 'vla-spec-node'
    assert module.executable(default_values(module, lifecycle='true')) == (
        'vla-spec-lifecycle-node')
    with pytest.raises(ValueError, match='lifecycle'):
        module.executable(default_values(module, lifecycle='yes'))
    scripts = (ROOT / 'setup.py').read_text()
    for name in ('vla-spec-node', 'vla-spec-lifecycle-node'):
        assert f"'{name} = vla_spec_ros.ros." in scripts, name


@pytest.mark.skipif(not HAS_TORCH, reason='the node loads the embedded model (needs torch)')
def test_two_robot_yaml_gives_each_robot_its_topics_and_parameters(probe):
    from rclpy.parameter import parameter_value_to_python
    from rclpy.parameter_client import AsyncParameterClient

    module = load_launch_module()
    options = module.node_options(default_values(module, node_name='vla_fleet'))
    options['parameters'].append(str(ROOT / 'config' / 'two_robots.yaml'))
    with NodeProcess(node_command(options), env=child_env(), cwd=str(ROOT)) as node:
        client = AsyncParameterClient(probe, '/vla_fleet')
        assert client.wait_for_services(timeout_sec=TIMEOUT), 'node did not come up'
        names = ['robots', 'mode', 'max_prefills_per_step', 'max_inflight',
                 'left_arm.frame_id', 'right_arm.frame_id',
                 'left_arm.max_linear_speed', 'right_arm.control_period']
        response = _spin_until(probe, client.get_parameters(names))
        got = {n: parameter_value_to_python(v) for n, v in zip(names, response.values)}
        assert got == {'robots': ['left_arm', 'right_arm'], 'mode': 'pipeline',
                       'max_prefills_per_step': 2, 'max_inflight': 14,
                       'left_arm.frame_id': 'left_tool0', 'right_arm.frame_id': 'right_tool0',
                       'left_arm.max_linear_speed': 0.2,
                       'right_arm.control_period': 0.2}     # node-wide value from robot.yaml
        wait_until(lambda: all(probe.count_subscribers(f'/{r}/image') >= 1
                               and probe.count_publishers(f'/{r}/twist') >= 1
                               for r in ('left_arm', 'right_arm')), what='robot topics')
    output = node.output
    assert 'ready' in output and 'left_arm, right_arm' in output, output


@pytest.mark.skipif(not HAS_TORCH, reason='the node loads the tiny model (needs torch)')
def test_the_unnorm_key_argument_reaches_both_robots_of_two_robots_yaml(probe):
    """robot.launch.py's two documented lines together (`params_file:=.../two_robots.yaml`,
    `model_path:=tiny unnorm_key:=bridge_orig`): before, two_robots.yaml pinned
    `left_arm.unnorm_key: ''`, a robot's own value, which beats the node-wide one the launch
    argument sets, so the node stopped with "unnorm_key: empty, but this checkpoint has 2
    datasets"."""
    from rclpy.parameter import parameter_value_to_python
    from rclpy.parameter_client import AsyncParameterClient

    module = load_launch_module()
    options = module.node_options(default_values(
        module, node_name='vla_two_keys', params_file=str(ROOT / 'config' / 'two_robots.yaml'),
        model_path='tiny', unnorm_key='bridge_orig', restrict_to_action_tokens='true'))
    assert options['parameters'][1]['unnorm_key'] == 'bridge_orig'
    with NodeProcess(node_command(options), env=child_env(), cwd=str(ROOT)) as node:
        client = AsyncParameterClient(probe, '/vla_two_keys')
        assert client.wait_for_services(timeout_sec=TIMEOUT), 'node did not come up'
        names = ['unnorm_key', 'left_arm.unnorm_key', 'right_arm.unnorm_key']
        future = client.get_parameters(names)   # answered once the node is built: ready
        wait_until(lambda: probe.executor_for_tests.spin_until_future_complete(
            future, timeout_sec=0.2) or future.done() or node.popen.poll() is not None,
            what='the parameters, or the node to end')
        assert future.done(), f'the node ended: {node.popen.communicate()[0][-2000:]}'
        got = [parameter_value_to_python(v) for v in future.result().values]
        assert got == ['bridge_orig'] * 3
    assert 'ready' in node.output and 'left_arm, right_arm' in node.output, node.output


@pytest.mark.skipif(not HAS_RCLPY, reason='rclpy and the ROS message wheels are not installed')
@pytest.mark.parametrize('old, new, words', [
    ('    linear_scale: 1.0', '    linear_scal: 1.0', 'linear_scal'),       # misspelled key
    ('    control_period: 0.2', '    control_period: 0.0', 'control_period'),  # out of range
    ('    control_period: 0.2', '    control_period: 1', 'control_period'),    # int for float
    ('    frame_id: base_link', "    frame_id: ''", 'frame_id'),             # invalid value
])
def test_bad_params_file_fails_loudly(tmp_path, old, new, words):
    text = (ROOT / 'config' / 'robot.yaml').read_text()
    assert old in text
    bad = tmp_path / 'bad.yaml'
    bad.write_text(text.replace(old, new))
    argv = [sys.executable, '-m', 'vla_spec_ros.ros.node', '--ros-args', '--params-file',
            str(bad)]
    result = subprocess.run(argv, env=child_env(), cwd=str(ROOT), capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == 1, result.stdout + result.stderr
    assert words in result.stderr


@pytest.mark.skipif(not HAS_RCLPY, reason='rclpy and the ROS message wheels are not installed')
def test_a_record_dir_that_cannot_be_made_stops_the_start_before_the_model_loads(tmp_path):
    """The review's case: a record_dir under a file ended the node with a raw traceback
    (FileExistsError), after the model had loaded. Now the start ends at once with one line
    naming the parameter, before `loading ...`."""
    blocker = tmp_path / 'afile'
    blocker.write_text('not a folder')
    argv = [sys.executable, '-m', 'vla_spec_ros.ros.node', '--ros-args', '-p',
            f'record_dir:={blocker}']
    result = subprocess.run(argv, env=child_env(), cwd=str(ROOT), capture_output=True,
                            text=True, timeout=TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"record_dir: cannot create '{blocker}/' for recordings" in output, output
    assert 'Traceback' not in output and 'loading' not in output, output


# ---- the launch arguments the docs name -----------------------------------------------------
# (`ros2 launch` itself: test_ros2_cli.py, test_ros2_fleet_launch.py, test_sim_launch.py)

def _declared(file_name):
    return [name for name, _, _ in launch_util.load_launch_module(file_name).ARGUMENTS]


def _section(path, heading):
    text = path.read_text()
    section = text[text.index(heading) + len(heading):]
    return section[:section.index('\n#')] if '\n#' in section else section


def test_every_robot_launch_argument_is_in_the_node_docs_table_and_back():
    table = [line for line in _section(ROOT / 'docs' / 'node.md', '\n## Launch\n').splitlines()
             if line.startswith('| `')]
    documented = [name for line in table for name in re.findall(r'`(\w+)`', line.split('|')[1])]
    assert sorted(documented) == sorted(_declared('robot.launch.py'))


def test_every_fleet_and_sim_launch_argument_is_documented_and_back():
    text = ' '.join((ROOT / 'docs' / 'fleet.md').read_text().split())
    sentence = text[text.index('Launch arguments: '):].split('. ')[0]
    assert sorted(re.findall(r'`(\w+)` \(', sentence)) == sorted(_declared('fleet.launch.py'))
    text = ' '.join((ROOT / 'docs' / 'demo.md').read_text().split())
    sentence = text[text.index('`sim.launch.py` arguments: '):].split('. ')[0]
    documented = re.findall(r'`(\w+)`', sentence.split(':', 1)[1])
    assert sorted(documented) == sorted(_declared('sim.launch.py'))


def test_every_documented_ros2_launch_line_uses_declared_arguments():
    from ros2_commands import doc_commands, launch_arguments

    lines = [(path, number, argv) for path in [ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')]
             for number, argv in doc_commands(path) if argv[1] == 'launch']
    assert {argv[3] for _, _, argv in lines} == {'robot.launch.py', 'fleet.launch.py',
                                                 'sim.launch.py'}
    for path, number, argv in lines:
        assert argv[2] == 'vla_spec_ros', (path.name, number)
        unknown = set(launch_arguments(argv)) - set(_declared(argv[3]))
        assert not unknown, f'{path.name}:{number}: {sorted(unknown)} not declared in {argv[3]}'
