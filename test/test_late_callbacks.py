"""An executor callback that outlives the entities it uses (ros/late_callbacks.py): on a real
rclpy node, a callback publishing through a destroyed publisher ends quietly once wrapped
(unwrapped, rclpy raises InvalidHandle: the case is real), any other error still propagates,
and a wrapped subscription callback keeps its signature (rclpy still hands it the message
info over DDS)."""
import importlib.util
import os
import time

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None for m in ('rclpy', 'std_msgs'))
needs_ros = pytest.mark.skipif(not HAS_ROS, reason='needs rclpy and the std_msgs wheels')

DOMAIN_ID = 211 + (os.getpid() % 10)


@pytest.fixture
def node():
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    node = rclpy.create_node('late_callbacks_probe', context=context)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)


@needs_ros
def test_a_callback_publishing_through_a_destroyed_publisher_ends_quietly(node):
    from rclpy._rclpy_pybind11 import InvalidHandle
    from std_msgs.msg import String

    from vla_spec_ros.ros.late_callbacks import tolerating_destroyed

    publisher = node.create_publisher(String, 'late_callbacks_out', 10)
    sent = []

    def publish_once():
        publisher.publish(String(data='x'))
        sent.append(True)
        return 'published'

    assert tolerating_destroyed(publish_once)() == 'published' and sent == [True]
    node.destroy_publisher(publisher)
    with pytest.raises(InvalidHandle):
        publish_once()
    assert tolerating_destroyed(publish_once)() is None
    assert sent == [True]


@needs_ros
def test_other_errors_still_propagate():
    from vla_spec_ros.ros.late_callbacks import tolerating_destroyed

    def broken():
        raise ValueError('a real bug')

    with pytest.raises(ValueError, match='a real bug'):
        tolerating_destroyed(broken)()


@needs_ros
def test_a_wrapped_subscription_callback_still_gets_the_message_info(node):
    import rclpy
    from std_msgs.msg import String

    from vla_spec_ros.ros.late_callbacks import tolerating_destroyed

    received = []
    node.create_subscription(String, 'late_callbacks_loop',
                             tolerating_destroyed(lambda msg, info: received.append((msg, info))),
                             10)
    publisher = node.create_publisher(String, 'late_callbacks_loop', 10)
    executor = rclpy.executors.SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    deadline = time.monotonic() + 30.0
    while not received and time.monotonic() < deadline:
        publisher.publish(String(data='hello'))
        executor.spin_once(timeout_sec=0.1)
    executor.remove_node(node)
    assert received, 'no message came back within 30 s'
    msg, info = received[0]
    assert msg.data == 'hello' and info['source_timestamp'] > 0
