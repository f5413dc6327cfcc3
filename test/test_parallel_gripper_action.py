"""ParallelGripperCommand goals from the node to a real rclpy ActionServer, over DDS: what
ros2_controllers' parallel_gripper_action_controller serves (ros/gripper_action.py).

control_msgs is not on PyPI: where it is not installed, its ParallelGripperCommand action is
generated from test/gripper_interface/control_msgs (upstream's definition) by
test/ros_interfaces.py, as test_gripper_action.py does for GripperCommand. The node runs in
this process (control_msgs is imported when its gripper client is made) with
`gripper_action_type: parallel_gripper`; this process serves the action.

Checked: the node's client is a ParallelGripperCommand client on the configured action; each
goal's JointState carries name [gripper_joint_name], position [the value published on
~/gripper], effort [gripper_max_effort] and no velocity; a goal is sent only when the position
changes; a run-time gripper_max_effort reaches the next goal.
"""
import importlib.util
import os
import threading
import time

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs',
                        'action_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')
DOMAIN_ID = 161 + (os.getpid() % 10)     # Fast DDS takes domains 0..232 only
ACTION = '/gripper_controller/gripper_cmd'
JOINT = 'panda_finger_joint1'
INSTRUCTION = 'close the gripper on the block'
OPEN, CLOSED = 0.04, 0.0
MAX_EFFORT = 7.5
TIMEOUT = 60.0


class ParallelGripperServer:
    """A ParallelGripperCommand action server that records each goal and succeeds at once."""

    def __init__(self, node):
        from control_msgs.action import ParallelGripperCommand
        from rclpy.action import ActionServer

        self._type = ParallelGripperCommand
        self._lock = threading.Lock()
        self.goals = []        # (names, positions, velocities, efforts)
        self.server = ActionServer(node, ParallelGripperCommand, ACTION, self._execute)

    def _execute(self, goal_handle):
        command = goal_handle.request.command
        with self._lock:
            self.goals.append((list(command.name), list(command.position),
                               list(command.velocity), list(command.effort)))
        goal_handle.succeed()
        result = self._type.Result()
        result.state.name = list(command.name)
        result.state.position = list(command.position)
        result.reached_goal = True
        return result

    def snapshot(self):
        with self._lock:
            return list(self.goals)


@pytest.fixture(scope='module')
def graph():
    from rclpy.parameter import Parameter
    from ros_interfaces import forget_prefix, interface_prefix, use_prefix
    from ros_probe import Probe, ros_graph

    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros.node import VLASpecNode

    prefix = interface_prefix('control_msgs')
    use_prefix(prefix, 'control_msgs')
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    with ros_graph(DOMAIN_ID, 'parallel_gripper_probe', num_threads=2) as graph:
        context, executor, probe_node = graph
        server = ParallelGripperServer(probe_node)
        overrides = {'unnorm_key': 'bridge_orig', 'gripper_action_name': ACTION,
                     'gripper_action_type': 'parallel_gripper', 'gripper_joint_name': JOINT,
                     'gripper_max_effort': MAX_EFFORT, 'gripper_open_position': OPEN,
                     'gripper_closed_position': CLOSED, 'max_action_age': 60.0}
        node = VLASpecNode(policy, context=context, parameter_overrides=[
            Parameter(k, value=v) for k, v in overrides.items()])
        executor.add_node(node)
        try:
            yield Probe(probe_node, 'vla_spec'), server, probe_node
        finally:
            executor.remove_node(node)
            node.destroy_node()
    forget_prefix(prefix)


def test_parallel_gripper_goals_follow_the_published_gripper_position(graph):
    from rclpy.action import get_action_client_names_and_types_by_node
    from std_msgs.msg import String
    from std_srvs.srv import SetBool

    from ros_probe import wait_until

    probe, server, probe_node = graph

    def node_action_clients():
        try:       # raises until the node is discovered
            return get_action_client_names_and_types_by_node(probe_node, 'vla_spec', '/')
        except Exception:
            return []
    wait_until(lambda: (ACTION, ['control_msgs/action/ParallelGripperCommand'])
               in node_action_clients(), timeout=TIMEOUT,
               what='the node\'s ParallelGripperCommand client')
    probe.instruction_pub.publish(String(data=INSTRUCTION))
    wait_until(lambda: probe.get_param('instruction') == INSTRUCTION, what='instruction')
    response = probe.call(probe.enable_client, SetBool.Request(data=True))
    assert response.success, response.message

    image = np.random.default_rng(3).integers(0, 256, (48, 64, 3), dtype=np.uint8)

    def frame():
        """Publish one frame (same pixels, fresh stamp); the ~/gripper value it produced."""
        start = len(probe.grippers.snapshot())
        answered = probe.send(probe.raw_image(image),
                              lambda: probe.grippers.find(lambda m: True, start),
                              timeout=TIMEOUT)
        return answered[1].data[0]

    def settle(count=0):
        """The goals, once `count` have arrived and no more came for half a second (the node
        sends a goal right after publishing the ~/gripper value)."""
        wait_until(lambda: len(server.snapshot()) >= count, what=f'{count} goals')
        time.sleep(0.5)
        return server.snapshot()

    def goal(position, effort):
        return ([JOINT], [position], [], [effort])

    # Frames until the first goal: the client may need a moment to match the server.
    first = frame()
    deadline = time.monotonic() + TIMEOUT
    while not settle() and time.monotonic() < deadline:
        assert frame() == first
    assert first in (OPEN, CLOSED)
    assert settle(1) == [goal(first, MAX_EFFORT)]
    for _ in range(3):                          # the same position: no new goal
        assert frame() == first
    assert settle() == [goal(first, MAX_EFFORT)]

    # Inverting the mapping flips the position: exactly one new goal, with the new effort.
    assert probe.set_param('gripper_max_effort', 3.5).successful
    assert probe.set_param('gripper_invert', True).successful
    flipped = frame()
    assert flipped == (CLOSED if first == OPEN else OPEN)
    assert frame() == flipped
    assert settle(2) == [goal(first, MAX_EFFORT), goal(flipped, 3.5)]
