"""GripperCommand goals from the node to a real rclpy ActionServer, over DDS.

control_msgs is not on PyPI. Where it is not installed, its GripperCommand message and action
(test/gripper_interface/control_msgs: upstream's definitions, so the type hashes match) are
generated and built with the ROS 2 generators from PyPI, CMake and a C/C++ compiler
(test/ros_interfaces.py). Without that toolchain the test is skipped and says what is
missing.

The node runs as a process (its `control_msgs` import happens at start-up) with
`gripper_action_name` set; this process serves the action with a real `ActionServer` and feeds
frames. Checked: the goals' position is the value the node publishes on ~/gripper, their
max_effort is `gripper_max_effort` (also after changing it at run time), and a goal is sent
only when the position changes.
"""
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs',
                        'action_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
DOMAIN_ID = 221 + (os.getpid() % 10)    # other tests: 11..220
ACTION = '/gripper_controller/gripper_cmd'
INSTRUCTION = 'close the gripper on the block'
OPEN, CLOSED = 0.04, 0.0
MAX_EFFORT = 7.5
TIMEOUT = 60.0

pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')


# ---- control_msgs: installed, or generated and built here (test/ros_interfaces.py) ---------

@pytest.fixture(scope='module')
def control_msgs_prefix():
    """None when control_msgs is installed (a ROS distribution), else the generated prefix."""
    from ros_interfaces import forget_prefix, interface_prefix, use_prefix

    started = time.monotonic()
    prefix = interface_prefix('control_msgs')
    if prefix is not None:
        print(f'control_msgs prefix {prefix} ready in {time.monotonic() - started:.1f} s')
    use_prefix(prefix, 'control_msgs')
    yield prefix
    forget_prefix(prefix)


# ---- the action server, the probe and the node -----------------------------------------------

class GripperServer:
    """A GripperCommand action server that records each goal and succeeds at once."""

    def __init__(self, node):
        from control_msgs.action import GripperCommand
        from rclpy.action import ActionServer

        self._type = GripperCommand
        self._lock = threading.Lock()
        self.goals = []        # (position, max_effort)
        self.server = ActionServer(node, GripperCommand, ACTION, self._execute)

    def _execute(self, goal_handle):
        command = goal_handle.request.command
        with self._lock:
            self.goals.append((command.position, command.max_effort))
        goal_handle.succeed()
        result = self._type.Result()
        result.position, result.reached_goal = command.position, True
        return result

    def snapshot(self):
        with self._lock:
            return list(self.goals)


@pytest.fixture(scope='module')
def graph(control_msgs_prefix, tmp_path_factory):
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.node import Node

    from ros_interfaces import node_env
    from ros_probe import Probe

    with pytest.MonkeyPatch.context() as patch:     # discovery on this host only, as the node
        patch.setenv('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=DOMAIN_ID)
        probe_node = Node('gripper_probe', context=context)
    server = GripperServer(probe_node)
    executor = MultiThreadedExecutor(num_threads=2, context=context)
    executor.add_node(probe_node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    log_path = tmp_path_factory.mktemp('gripper_node') / 'node.log'
    argv = [sys.executable, '-m', 'vla_spec_ros.ros.node', '--ros-args',
            '-p', 'model_path:=tiny', '-p', 'restrict_to_action_tokens:=true',
            '-p', 'unnorm_key:=bridge_orig', '-p', f'gripper_action_name:={ACTION}',
            '-p', f'gripper_max_effort:={MAX_EFFORT}', '-p', f'gripper_open_position:={OPEN}',
            '-p', f'gripper_closed_position:={CLOSED}',
            # generous: the first inference of a busy CI machine may take seconds
            '-p', 'max_action_age:=60.0']
    with open(log_path, 'w') as log:
        process = subprocess.Popen(argv, env=node_env(DOMAIN_ID, [control_msgs_prefix]),
                                   cwd=str(ROOT),
                                   stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        yield Probe(probe_node, 'vla_spec'), server, probe_node, process, log_path
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        executor.shutdown()
        probe_node.destroy_node()
        rclpy.shutdown(context=context)
        thread.join(timeout=5.0)


def node_output(log_path):
    return log_path.read_text() if log_path.exists() else ''


def test_goals_follow_the_published_gripper_position(graph):
    from rclpy.action import get_action_client_names_and_types_by_node
    from std_msgs.msg import String
    from std_srvs.srv import SetBool

    from ros_probe import wait_until

    probe, server, probe_node, process, log_path = graph
    # The node came up with a GripperCommand client on the configured action.
    assert probe.params.wait_for_services(timeout_sec=TIMEOUT), node_output(log_path)

    def node_action_clients():
        try:       # raises until the node is discovered
            return get_action_client_names_and_types_by_node(probe_node, 'vla_spec', '/')
        except Exception:
            return []
    wait_until(lambda: (ACTION, ['control_msgs/action/GripperCommand']) in node_action_clients(),
               timeout=TIMEOUT, what='the node\'s GripperCommand client')
    assert 'control_msgs is not importable' not in node_output(log_path)
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

    # Frames until the first goal: the node's client may need a moment to match the server
    # (a frame before that sends nothing and leaves the goal pending).
    first = frame()
    deadline = time.monotonic() + TIMEOUT
    while not settle() and time.monotonic() < deadline:
        assert frame() == first
    assert first in (OPEN, CLOSED)
    assert settle(1) == [(first, MAX_EFFORT)]
    # The same position again: no new goal.
    for _ in range(3):
        assert frame() == first
    assert settle() == [(first, MAX_EFFORT)]

    # Inverting the gripper mapping flips the position: exactly one new goal, with the
    # max_effort set at run time.
    assert probe.set_param('gripper_max_effort', 3.5).successful
    assert probe.set_param('gripper_invert', True).successful
    flipped = frame()
    assert flipped == (CLOSED if first == OPEN else OPEN)
    for _ in range(2):
        assert frame() == flipped
    assert settle(2) == [(first, MAX_EFFORT), (flipped, 3.5)]
    # And back.
    assert probe.set_param('gripper_invert', False).successful
    assert frame() == first
    assert frame() == first
    assert settle(3) == [(first, MAX_EFFORT), (flipped, 3.5), (first, 3.5)]
    assert process.poll() is None, node_output(log_path)
