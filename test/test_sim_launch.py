"""launch/sim.launch.py: the VLA node + simulator bridge pair.

The options the launch file builds are checked for consistency (both nodes must share the
command conventions), then started as two processes (the nodes' own entry points with the same
`--ros-args`, as launch_ros would) for one short lock-step episode over DDS. Where ROS 2's
launch system is installed, docs/demo.md's own `ros2 launch vla_spec_ros sim.launch.py ...`
line runs as written from a colcon build, without a display, and ends by itself.
"""
import dataclasses
import importlib.util
import os
import pathlib
import subprocess

import pytest

import launch_util
import ros2_commands
from launch_util import default_values

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'sim.launch.py'
HAS_RCLPY = all(importlib.util.find_spec(m) is not None
                for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
DOMAIN_ID = 91 + (os.getpid() % 40)     # test_ros_node: 11..50, test_launch: 51..90
TIMEOUT = 120.0
DEMO_DOC = ROOT / 'docs' / 'demo.md'
LAUNCH_TIMEOUT = 300.0      # the docs' five episodes, model loading included, on a loaded CPU


def load_launch_module():
    return launch_util.load_launch_module(LAUNCH_FILE.name)


def test_both_nodes_share_the_command_conventions():
    from vla_spec_ros.ros import params
    from vla_spec_ros.sim.bridge_settings import BridgeSettings

    module = load_launch_module()
    vla, bridge = module.node_options(default_values(module, control_rate_hz='5.0',
                                                     sim_mode='realtime'))
    vla_params, bridge_params = vla['parameters'][1], bridge['parameters'][0]
    assert vla['parameters'][0] == str(ROOT / 'config' / 'robot.yaml')
    assert set(vla_params) <= set(params.PARAMETERS_BY_NAME)
    assert set(bridge_params) <= {f.name for f in dataclasses.fields(BridgeSettings)}
    for name in module.SHARED_COMMAND_PARAMETERS:
        assert vla_params[name] == bridge_params[name], name
    assert vla_params['control_period'] == bridge_params['control_period'] == 0.2
    assert vla_params['gripper_binarize'] is False and vla_params['max_action_age'] == 1.0
    assert dict(bridge['remappings']) == {'~/image': '/vla_spec/image',
                                          '~/instruction': '/vla_spec/instruction',
                                          '~/twist': '/vla_spec/twist',
                                          '~/gripper': '/vla_spec/gripper'}
    BridgeSettings(**bridge_params)      # valid settings
    with pytest.raises(ValueError, match='sim_mode'):
        module.node_options(default_values(module, sim_mode='fast'))


def test_a_chunked_model_is_refused_in_lockstep_and_served_in_realtime():
    module = load_launch_module()
    with pytest.raises(ValueError, match='chunked model'):
        module.node_options(default_values(module, model_path='metaworld-demo-chunk4'))
    vla, _ = module.node_options(default_values(module, model_path='metaworld-demo-chunk4',
                                                sim_mode='realtime'))
    assert vla['parameters'][1]['model_path'] == 'metaworld-demo-chunk4'


def test_bridge_image_size_defaults_to_the_embedded_model_input_size():
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.sim.bridge_settings import BridgeSettings

    module = load_launch_module()
    values = default_values(module)
    assert values['model_path'] == 'metaworld-demo'
    _, bridge = module.node_options(values)
    # The default model's input size: the VLA node does not resize the bridge's frames.
    assert bridge['parameters'][0]['image_size'] == preset('metaworld-demo').image_size == 64
    _, bridge = module.node_options(default_values(module, image_size='224'))
    assert BridgeSettings(**bridge['parameters'][0]).image_size == 224
    with pytest.raises(ValueError, match='image_size'):
        module.node_options(default_values(module, image_size='0'))


def _command(module_name, options):
    return launch_util.ros_args_command(module_name, options)


def _child_env():
    return launch_util.child_env(DOMAIN_ID, MUJOCO_GL='osmesa', OMP_NUM_THREADS='1')


def _skip_reason():
    if not HAS_RCLPY or importlib.util.find_spec('torch') is None:
        return 'needs rclpy, the ROS message wheels and torch'
    from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason
    return sim_unavailable_reason()


def test_launch_options_run_an_episode_between_two_processes():
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from vla_spec_ros import assets

    module = load_launch_module()
    changes = dict(task_name='drawer-close', episodes='1', max_steps='4')
    if assets.embedded_checkpoint('metaworld-demo') is None:
        changes['model_path'] = 'tiny'
    vla, bridge = module.node_options(default_values(module, **changes))
    if changes.get('model_path') == 'tiny':     # random weights: keep them on action tokens
        vla['parameters'][1]['restrict_to_action_tokens'] = True
        vla['parameters'][1]['unnorm_key'] = 'bridge_orig'
    env = _child_env()
    node = subprocess.Popen(_command('vla_spec_ros.ros.node', vla), env=env, cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        result = subprocess.run(_command('vla_spec_ros.harness.sim_bridge', bridge), env=env,
                                cwd=str(ROOT), capture_output=True, text=True,
                                timeout=TIMEOUT)
    finally:
        node.terminate()
        try:
            node_output = node.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            node.kill()
            node_output = node.communicate()[0]
    output = result.stdout + result.stderr
    assert result.returncode == 0, output + node_output
    assert 'episode 0:' in output, output
    # Every step was taken with a command from the VLA node (4 steps, 4 commands applied).
    assert 'num_steps=4' in output and 'commands_applied=4' in output, output


def test_docs_ros2_launch_line_runs_its_episodes_headless_and_ends():
    reason = _skip_reason() or ros2_commands.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    import re
    import tempfile

    argv = ros2_commands.find_command(ros2_commands.doc_commands(DEMO_DOC), 'ros2', 'launch',
                                      'vla_spec_ros', 'sim.launch.py')
    episodes = int(ros2_commands.launch_arguments(argv)['episodes'])
    ws, _ = launch_util.colcon_workspace()
    with tempfile.TemporaryDirectory() as logs:
        env = ros2_commands.cli_env(ws, DOMAIN_ID, logs)
        env.pop('DISPLAY', None)            # headless: rendering is off-screen
        env.setdefault('MUJOCO_GL', 'osmesa')
        ros2 = ros2_commands.Ros2(env, ws)
        with ros2.launch(argv, pathlib.Path(logs) / 'sim.log') as launched:
            code = launched.popen.wait(timeout=LAUNCH_TIMEOUT)
            output = launched.output()
    assert code == 0, output[-6000:]
    results = re.findall(r'\[sim_bridge\]: episode (\d+): EpisodeResult\(.*num_steps=(\d+)\)'
                         r'.*num_commands_applied=(\d+)', output)
    assert [int(index) for index, _, _ in results] == list(range(episodes)), output[-6000:]
    for _, steps, applied in results:       # every step took the VLA node's command
        assert steps == applied, output[-6000:]
    assert len(re.findall(r'process has finished cleanly', output)) == 2, output[-6000:]
    assert 'has died' not in output, output[-6000:]
