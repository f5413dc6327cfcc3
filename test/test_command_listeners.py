"""/diagnostics says when nothing receives a robot's commands (ros/command_listeners.py): no
subscriber on any motion command topic (a controller not running, a wrong remap, or a QoS
that does not match: rclpy counts matched subscriptions only). Pure rule on stand-in
publishers, then a real node over DDS with a real subscriber of each kind."""
import importlib.util
import os
from types import SimpleNamespace

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'geometry_msgs', 'diagnostic_msgs', 'sensor_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
needs_ros = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                               reason='needs rclpy + ROS message wheels and torch')

DOMAIN_ID = 161 + (os.getpid() % 30)


def _publisher(topic, count):
    return SimpleNamespace(topic_name=topic, get_subscription_count=lambda: count)


def test_one_topic_with_a_subscriber_is_enough_and_none_names_them_all():
    from vla_spec_ros.ros.command_listeners import unheard_topics

    assert unheard_topics([_publisher('/a/twist', 0), _publisher('/a/pose_target', 1)]) is None
    assert unheard_topics([_publisher('/a/twist', 0), None,
                           _publisher('/a/velocity_trajectory', 0)]) == [
        '/a/twist', '/a/velocity_trajectory']
    assert unheard_topics([]) is None


@pytest.mark.skipif(importlib.util.find_spec('diagnostic_msgs') is None,
                    reason='needs the ROS message wheels')
@pytest.mark.parametrize('count', [0, 1])
def test_a_disabled_robot_reports_its_subscribers_as_they_are_without_a_warning(count):
    """A disabled (or inactive) robot's command_subscribers said 'yes' with nobody listening:
    the integrator checking the wiring before enabling read a subscriber that was not there."""
    from diagnostic_msgs.msg import DiagnosticStatus

    from vla_spec_ros.ros.command_listeners import add_listener_status
    from vla_spec_ros.ros.diagnostics import OK, WARN

    status = DiagnosticStatus(level=bytes([WARN]), message='disabled')
    add_listener_status(status, [_publisher('/a/twist', count)], is_enabled=False)
    values = {kv.key: kv.value for kv in status.values}
    assert values['command_subscribers'] == ('yes' if count else 'none')
    assert (status.level[0], status.message) == (WARN, 'disabled')   # no warning added
    enabled = DiagnosticStatus(level=bytes([OK]), message='publishing actions')
    add_listener_status(enabled, [_publisher('/a/twist', count)], is_enabled=True)
    assert (enabled.level[0] == WARN) == (count == 0)


@needs_ros
def test_a_node_whose_twist_nobody_hears_warns_until_a_matching_subscriber_comes():
    from geometry_msgs.msg import TwistStamped
    from rclpy.parameter import Parameter
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from ros_probe import ros_graph, wait_until
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros.diagnostics import WARN
    from vla_spec_ros.ros.node import VLASpecNode

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    with ros_graph(DOMAIN_ID, 'listeners_probe') as (context, executor, probe):
        node = VLASpecNode(policy, node_name='vla_listen', context=context,
                           parameter_overrides=[Parameter('unnorm_key', value='bridge_orig'),
                                                Parameter('enabled', value=True)])
        try:
            channel = node.serving.channels[0]

            def status():
                return channel.diagnostic('ar')

            first = status()
            assert first.level[0] == WARN and 'no subscriber on /vla_listen/twist' in \
                first.message
            # A subscriber whose QoS cannot match the node's volatile publisher: still none.
            latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
            probe.create_subscription(TwistStamped, '/vla_listen/twist', lambda m: None,
                                      latched)
            assert status().level[0] == WARN
            probe.create_subscription(TwistStamped, '/vla_listen/twist', lambda m: None, 10)
            wait_until(lambda: status().level[0] != WARN or 'no subscriber' not in
                       status().message, what='the matching subscriber counted')
            values = {kv.key: kv.value for kv in status().values}
            assert values['command_subscribers'] == 'yes'
            assert 'no subscriber' not in status().message
        finally:
            node.destroy_node()
