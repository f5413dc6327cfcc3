"""``node.run`` (the node's ``main``): an error raised by a callback that races Ctrl-C's
shutdown of the context is part of shutting down (exit 0); the same error while the context is
up is a fault and propagates. Real rclpy, the process's default context."""
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec('rclpy') is None
                                or importlib.util.find_spec('std_msgs') is None,
                                reason='needs rclpy + std_msgs wheels')


def _node_whose_timer(shutdown_first: bool):
    """A node factory: its timer publishes once, after shutting the context down (as
    Ctrl-C's signal handler does) when ``shutdown_first``, else raising while it is up."""
    import rclpy
    from rclpy.node import Node
    from std_msgs.msg import String

    def factory():
        node = Node('run_shutdown_probe')
        publisher = node.create_publisher(String, 'run_shutdown_probe', 1)

        def tick():
            if shutdown_first:
                rclpy.shutdown()
                publisher.publish(String(data='late'))    # fails: the context is invalid
            else:
                raise RuntimeError('a fault while serving')
        node.create_timer(0.01, tick)
        return node
    return factory


def test_a_callback_racing_the_shutdown_exits_cleanly():
    from vla_spec_ros.ros.node import run
    assert run(_node_whose_timer(shutdown_first=True), 'probe', args=[]) == 0


def test_a_fault_while_the_context_is_up_propagates():
    from vla_spec_ros.ros.node import run
    with pytest.raises(RuntimeError, match='a fault while serving'):
        run(_node_whose_timer(shutdown_first=False), 'probe', args=[])
