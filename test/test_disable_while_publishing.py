"""Disabling a robot (`enabled` false, `~/enable` false) while the worker is publishing its
action: the action decided before the disable may go out, but never after the disable has
returned, and the robot's last command is a zero. Before, `Serving.apply` did not wait for the
worker's turn: the action went out after `ros2 param set ... enabled false` had succeeded, and
only the watchdog's next zero (a period later) stopped it. Real node over DDS, the race window
opened on purpose (the disable arrives while the worker prepares a command)."""
import importlib.util
import os
import threading
import time

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')

DOMAIN_ID = 191 + (os.getpid() % 10)     # Fast DDS takes domains 0..232 only
NAME = 'vla_disable_race'


def _is_zero(msg) -> bool:
    t = msg.twist
    return all(v == 0.0 for v in (t.linear.x, t.linear.y, t.linear.z,
                                  t.angular.x, t.angular.y, t.angular.z))


def test_no_action_goes_out_after_a_disable_has_returned():
    from rclpy.parameter import Parameter

    from camera_stream import CameraStream
    from ros_probe import ros_graph, wait_until
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros.node import VLASpecNode

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    graph = ros_graph(DOMAIN_ID, 'disable_race_probe', num_threads=2)
    with graph as (context, executor, probe):
        node = VLASpecNode(policy, node_name=NAME, context=context, parameter_overrides=[
            Parameter('unnorm_key', value='bridge_orig'), Parameter('enabled', value=True),
            Parameter('instruction', value='wipe the table'),
            Parameter('max_action_age', value=5.0), Parameter('max_linear_speed', value=10.0),
            Parameter('max_angular_speed', value=20.0)])
        executor.add_node(node)
        camera = CameraStream(probe, [f'/{NAME}/image'])
        channel = node.serving.channels[0]
        output = channel.outputs[0]
        published, lock = [], threading.Lock()     # (time.monotonic, is_zero), in order
        publish = output.twist_pub.publish

        def recording_publish(msg):
            with lock:
                published.append((time.monotonic(), _is_zero(msg)))
            publish(msg)
        output.twist_pub.publish = recording_publish
        disabled_at = []
        prepare = channel.prepare

        def prepare_while_disabled(info, settings):
            # The disable comes from the executor (`ros2 param set`, ~/enable) while the
            # worker is between its decision and its publish.
            if not disabled_at and any(not zero for _, zero in published):
                def disable():
                    node.set_parameters([Parameter('enabled', value=False)])
                    disabled_at.append(time.monotonic())
                thread = threading.Thread(target=disable)
                thread.start()
                thread.join(0.5)        # done at once before the fix; waits for us after it
            return prepare(info, settings)
        channel.prepare = prepare_while_disabled
        try:
            wait_until(lambda: disabled_at, timeout=60.0, what='the disable')
            time.sleep(0.5)
        finally:
            camera.close()
            executor.remove_node(node)
            node.destroy_node()
        with lock:
            after = [(t, zero) for t, zero in published if t > disabled_at[0]]
        assert all(zero for _, zero in after), (
            f'{sum(not zero for _, zero in after)} action(s) published after the disable '
            'returned')
        assert published[-1][1], 'the last command is not a zero'
