"""The node's configuration travels as one object: parameter values -> one
`params.Configuration` (EngineConfig + NodeSettings + each robot's settings), built in one
function, and its EngineConfig is the very object the engine runs with (no keyword copy, no
renaming on the way).

Pure part: the mapping. Torch part: `node.load_policy` hands the object to
`VLAPolicy.from_config`. DDS part: a real `vla_spec` node built from parameter overrides.
"""
import importlib.util
import os

import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.ros import params

HAS_TORCH = importlib.util.find_spec('torch') is not None
HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))

DOMAIN_ID = 141 + (os.getpid() % 40)
ENGINE_VALUES = {'model_path': 'tiny', 'mode': 'pipeline', 'max_inflight': 5,
                 'max_inflight_per_stream': 3, 'draft_path': '',
                 'restrict_to_action_tokens': True, 'unnorm_key': 'bridge_orig'}


def test_the_parameters_build_one_configuration():
    config = params.configuration_from_parameters({
        'robots': ['left', 'right'], 'left.frame_id': 'left_base', 'max_inflight': 5,
        'max_inflight_per_stream': 3})
    assert isinstance(config.engine, EngineConfig)
    assert config.engine.max_inflight_per_stream == 3      # the parameter's own name
    assert config.engine.max_streams == 2                  # one engine stream per robot
    assert config.node.robots == ('left', 'right')
    assert config.robots['left'].frame_id == 'left_base'
    assert config.robots['right'].frame_id == 'base_link'  # the node-wide value
    assert params.configuration_from_parameters({}).robots == {
        '': params.default_node_settings()}
    with pytest.raises(ValueError, match='left.frame_id'):
        params.configuration_from_parameters({'robots': ['left'], 'left.frame_id': ' '})
    with pytest.raises(ValueError, match='unknown parameters'):
        params.configuration_from_parameters({'max_inflight_per_robot': 3})


@pytest.mark.parametrize('name, value', [('servo_node', '/servo_node'),
                                         ('tool_pose_topic', '/tool_pose'),
                                         ('gripper_action_name', '/gripper/gripper_cmd')])
def test_two_robots_may_not_share_a_servo_a_tool_pose_or_a_gripper(name, value):
    """A node-wide value (a launch argument, fleet parameters) reaches every robot: two arms
    on one Servo (a hold of one pauses the other), one tool pose or one gripper are refused,
    naming the robot; their own values are accepted."""
    with pytest.raises(ValueError, match=f'right.{name}: .* is also left\'s'):
        params.configuration_from_parameters({'robots': ['left', 'right'], name: value})
    config = params.configuration_from_parameters({
        'robots': ['left', 'right'], f'left.{name}': value + '_l', f'right.{name}': value})
    assert getattr(config.robots['right'], name) == value
    assert getattr(params.configuration_from_parameters({name: value}).node, name) == value


def test_two_robots_may_not_take_their_tool_pose_from_one_tf_transform():
    values = {'robots': ['left', 'right'], 'pose_targets': True}
    with pytest.raises(ValueError, match='right.tool_frame: TF base_link -> .* is also left'):
        params.configuration_from_parameters(values)
    config = params.configuration_from_parameters(dict(values, **{
        'left.frame_id': 'left_base', 'right.frame_id': 'right_base'}))
    assert config.robots['left'].tool_frame == config.robots['right'].tool_frame


@pytest.mark.skipif(not HAS_TORCH, reason='needs torch')
def test_the_policy_runs_with_the_configuration_object():
    from vla_spec_ros.ros.node import load_policy

    config = params.configuration_from_parameters(ENGINE_VALUES)
    policy = load_policy(config)
    assert policy.engine.config is config.engine
    # The value reached the scheduler that enforces it.
    assert policy.engine.strategy.scheduler.max_inflight_per_stream == 3
    with pytest.raises(TypeError, match='config: expected an EngineConfig'):
        type(policy).from_config('tiny', {'mode': 'ar'})


@pytest.mark.skipif(not (HAS_ROS and HAS_TORCH), reason='needs rclpy + ROS messages, torch')
def test_a_node_hands_its_parameters_to_the_engine_as_one_object():
    from rclpy.parameter import Parameter

    from ros_probe import ros_graph
    from vla_spec_ros.ros.node import VLASpecNode

    with ros_graph(DOMAIN_ID, 'node_config_probe') as (context, executor, probe_node):
        node = VLASpecNode(node_name='vla_config', context=context, parameter_overrides=[
            Parameter(name, value=value) for name, value in ENGINE_VALUES.items()])
        try:
            serving = node.serving
            assert serving.engine.config is serving.config.engine
            assert serving.engine.strategy.scheduler.max_inflight_per_stream == 3
            assert serving.settings is serving.config.node
            assert [c.settings for c in serving.channels] == [serving.config.robots['']]
            # A tunable change builds the next configuration; the engine takes it before its
            # next submit. A load-time one is refused with its name.
            assert node.set_parameters([Parameter('tree_depth', value=5)])[0].successful
            assert serving.config.engine.tree_depth == 5
            assert serving.config.engine.max_inflight_per_stream == 3
            refused = node.set_parameters([Parameter('max_inflight_per_stream', value=2)])[0]
            assert not refused.successful and 'max_inflight_per_stream' in refused.reason
        finally:
            node.destroy_node()
