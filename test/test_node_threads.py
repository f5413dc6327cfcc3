"""NodeThreads: each group of nodes spun on its own thread, over real DDS (rclpy)."""
import importlib.util
import os
import threading
import time

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None for m in ('rclpy', 'std_msgs'))
pytestmark = pytest.mark.skipif(not HAS_ROS, reason='needs rclpy and std_msgs')


@pytest.fixture()
def context():
    import rclpy
    context = rclpy.Context()
    rclpy.init(context=context)
    yield context
    rclpy.try_shutdown(context=context)


def test_a_blocked_group_does_not_stall_another(context):
    """A callback that blocks one group's thread leaves the other group's callbacks running:
    what a deployment of separate processes gives, and what one shared executor thread would
    not."""
    from rclpy.node import Node
    from std_msgs.msg import Int32

    from vla_spec_ros.harness.node_threads import NodeThreads

    namespace = f'/node_threads_{os.getpid()}'
    blocker, listener, talker = (Node(name, context=context, namespace=namespace)
                                 for name in ('blocker', 'listener', 'talker'))
    release, received = threading.Event(), []
    blocker.create_timer(0.01, lambda: release.wait(5.0))        # holds its thread
    listener.create_subscription(Int32, 'numbers', lambda m: received.append(m.data), 10)
    publisher = talker.create_publisher(Int32, 'numbers', 10)
    spinning = NodeThreads(context, [[blocker], [listener]])
    try:
        deadline = time.monotonic() + 10.0
        while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for number in range(5):
            publisher.publish(Int32(data=number))
        while len(received) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert received == [0, 1, 2, 3, 4]
        assert not release.is_set()          # the other group was blocked all along
    finally:
        release.set()
        spinning.shutdown()
        spinning.shutdown()                  # idempotent
        for node in (blocker, listener, talker):
            node.destroy_node()


def test_an_empty_group_is_refused(context):
    from vla_spec_ros.harness.node_threads import NodeThreads
    with pytest.raises(ValueError, match=r'groups\[0\]'):
        NodeThreads(context, [[]])
