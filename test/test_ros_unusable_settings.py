"""Settings under which the engine would refuse every frame, over DDS on the real node.

- A state the model cannot read is refused when it is set, as at start-up (the embedded FAST
  model reads a 1-value state; `state_input: array`). Before, `ros2 param set
  state_joint_names` to two joints was accepted (and shown by `param get`), then every frame
  was refused as bad input and the robot held.
- An instruction the model cannot take (over max_instruction_tokens) is kept, so the robot
  holds rather than going on with the old task, and the log says so once, at once, naming
  the parameter (before: only the per-frame refusals said it)."""
import importlib.util
import os

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
pytestmark = pytest.mark.skipif(not HAS_ROS, reason='needs rclpy + ROS message wheels')

DOMAIN_ID = 61 + (os.getpid() % 10)


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph
    with ros_graph(DOMAIN_ID, 'unusable_probe') as graph:
        yield graph


def test_a_state_size_the_model_cannot_read_is_refused_at_set_time(ros):
    from rclpy.parameter import Parameter

    from ros_probe import Probe
    from vla_spec_ros.assets import embedded_checkpoint
    from vla_spec_ros.ros.node import VLASpecNode

    if embedded_checkpoint('metaworld-demo-fast') is None:
        pytest.skip('metaworld-demo-fast is not shipped in this tree')
    context, executor, probe_node = ros
    overrides = {'model_path': 'metaworld-demo-fast', 'state_input': 'array',
                 'state_joint_names': ['s0']}
    node = VLASpecNode(context=context, node_name='vla_state_size', parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    try:
        probe = Probe(probe_node, 'vla_state_size')
        result = probe.set_param('state_joint_names', ['s0', 's1'])
        assert not result.successful
        assert result.reason.startswith('state_joint_names: 2 joints give a state this model '
                                        'cannot read'), result.reason
        assert 'at most 1' in result.reason
        assert probe.get_param('state_joint_names') == ['s0']
        assert probe.set_param('state_joint_names', ['wrist']).successful     # a rename
        assert probe.get_param('state_joint_names') == ['wrist']
    finally:
        executor.remove_node(node)
        node.destroy_node()


def test_an_instruction_the_model_cannot_take_is_kept_and_said_once_naming_it(ros):
    from rclpy.parameter import Parameter

    from ros_probe import LogProbe, Probe
    from vla_spec_ros.ros.node import VLASpecNode

    context, executor, probe_node = ros
    log = LogProbe(probe_node, 'vla_long_instruction')
    node = VLASpecNode(context=context, node_name='vla_long_instruction', parameter_overrides=[
        Parameter('model_path', value='tiny'), Parameter('unnorm_key', value='bridge_orig'),
        Parameter('max_instruction_tokens', value=16)])
    executor.add_node(node)
    try:
        probe = Probe(probe_node, 'vla_long_instruction')
        long = ' '.join(['pick up the red block'] * 20)
        assert probe.set_param('instruction', long).successful
        assert probe.get_param('instruction') == long
        line = log.wait_for('instruction:', 'max_instruction_tokens',
                            'the robot holds until an instruction it can use')
        assert line.level == line.ERROR
        assert probe.set_param('instruction', 'pick up the red block').successful
        assert len([m for _, m in log.lines.snapshot() if m.name == log.node_name
                    and 'the robot holds until an instruction' in m.msg]) == 1
    finally:
        log.close()
        executor.remove_node(node)
        node.destroy_node()
