"""A gripper action server replaced by a new instance while the model keeps asking for the
same position: the new server gets the standing goal (ros/gripper_action.py). Over real DDS,
nothing of rclpy mocked: the node's GripperActionOutput on a real node, the controller a real
ActionServer on a node of its own Context (its own DDS participant, as its own process).

Two ways a controller is replaced, each checked once (with each action type once):
  killed     the first server stops answering (a process killed outright) but its entries stay
             in discovery beside the new one's (in this process, they never expire), so the
             client always finds a server ready. Before, nothing was sent to the new one.
  restarted  the first server is destroyed and the new one is up before the next command:
             the client never sees the action unready either.
Checked: the new server gets the goal for the position commanded all along, it succeeds, no
further goal follows, and /diagnostics counts one new server (`gripper_action_restarts`).
"""
import importlib.util
import itertools
import os
import threading
import time
from types import SimpleNamespace

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'action_msgs', 'diagnostic_msgs'))
pytestmark = pytest.mark.skipif(not HAS_ROS,
                                reason='needs rclpy, action_msgs and diagnostic_msgs')

DOMAIN_ID = 171 + (os.getpid() % 29)     # Fast DDS takes domains 0..232 only
CLOSED = 0.0
JOINT = 'panda_finger_joint1'
SETTINGS = SimpleNamespace(gripper_max_effort=7.5, gripper_joint_name=JOINT)
COMMAND_PERIOD_S = 0.02
TIMEOUT = 30.0          # well above gripper_action.RESULT_TIMEOUT_S: a goal lost while the new
#                         server matched the client is sent again after it
RUNS = itertools.count()


@pytest.fixture(scope='module')
def graph():
    from ros_interfaces import forget_prefix, interface_prefix, use_prefix
    from ros_probe import ros_graph

    prefix = interface_prefix('control_msgs')
    use_prefix(prefix, 'control_msgs')
    with ros_graph(DOMAIN_ID, 'gripper_respawn_client', num_threads=2) as graph:
        yield graph
    forget_prefix(prefix)


class GripperController:
    """A gripper action server (`kind` as gripper_action_type) on a node of its own Context,
    spun on its own thread; records each goal's position and succeeds at once."""

    def __init__(self, kind: str, action: str):
        import rclpy
        from rclpy.action import ActionServer
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node

        from vla_spec_ros.ros.gripper_action import _action_type

        self._type = _action_type(kind)
        self._lock = threading.Lock()
        self.goals = []
        self.destroyed = False
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=DOMAIN_ID)
        self.node = Node('gripper_controller', context=self.context)
        self.server = ActionServer(self.node, self._type, action, self._execute)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _execute(self, goal_handle):
        position = goal_handle.request.command.position     # parallel_gripper: [position]
        with self._lock:
            self.goals.append(position if isinstance(position, float) else position[0])
        goal_handle.succeed()
        return self._type.Result()

    def snapshot(self):
        with self._lock:
            return list(self.goals)

    def kill(self):
        """Answers nothing more; its entries stay in discovery (a process killed outright:
        until their lease runs out)."""
        self.executor.shutdown()
        self.thread.join(timeout=5.0)

    def destroy(self):
        import rclpy

        if self.destroyed:
            return
        self.destroyed = True
        self.kill()
        self.server.destroy()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def command_until(output, predicate, what, timeout=TIMEOUT):
    """Send the closed position every COMMAND_PERIOD_S (the model asking for it) until
    `predicate()`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f'timed out after {timeout} s waiting for {what}'
        output.send(CLOSED, SETTINGS)
        time.sleep(COMMAND_PERIOD_S)


def diagnostics(output) -> dict:
    from diagnostic_msgs.msg import DiagnosticStatus

    status = DiagnosticStatus()
    output.add_to_status(status)
    return {item.key: item.value for item in status.values}


@pytest.mark.parametrize('kind, how', [('gripper_command', 'killed'),
                                       ('parallel_gripper', 'restarted')])
def test_a_new_server_instance_gets_the_standing_goal(graph, kind, how):
    from ros_probe import wait_until

    from vla_spec_ros.ros.gripper_action import GripperActionOutput
    from vla_spec_ros.ros.servo_presence import server_gids

    context, executor, client_node = graph
    action = f'/run{next(RUNS)}/gripper_controller/gripper_cmd'   # apart from earlier runs'
    first = GripperController(kind, action)
    output = GripperActionOutput(client_node, action, kind, 'robot')
    second = None
    try:
        def listed():
            return server_gids(client_node, f'{action}/_action/send_goal')

        # The first server gets the goal once the client matches it, and it succeeds.
        command_until(output, lambda: first.snapshot(), 'the first goal')
        command_until(output, lambda: diagnostics(output)['gripper_action']
                      == 'goal 0.0000 succeeded', 'the first goal to succeed')
        # The first server's entries listed at a command: the instance the goal went to.
        first_gids = wait_until(listed, what='the first server in the graph')
        output.send(CLOSED, SETTINGS)
        assert first.snapshot() == [CLOSED]

        if how == 'killed':
            first.kill()
        else:
            first.destroy()
        second = GripperController(kind, action)
        # No command until the new server is listed and the client finds the action ready.
        wait_until(lambda: listed() - first_gids and output.client.server_is_ready(),
                   what='the new server in the graph')
        if how == 'killed':
            assert listed() >= first_gids         # the killed one is still listed

        command_until(output, lambda: second.snapshot(), 'a goal to the new server')
        command_until(output, lambda: diagnostics(output)['gripper_action']
                      == 'goal 0.0000 succeeded', 'the new server\'s goal to succeed')
        goals = second.snapshot()
        assert set(goals) == {CLOSED}
        for _ in range(10):                       # the same position: nothing more is sent
            output.send(CLOSED, SETTINGS)
            time.sleep(COMMAND_PERIOD_S)
        assert second.snapshot() == goals and first.snapshot() == [CLOSED]
        assert diagnostics(output) == {'gripper_action': 'goal 0.0000 succeeded',
                                       'gripper_action_restarts': '1'}
    finally:
        output.destroy()
        for server in (first, second):
            if server is not None:
                server.destroy()
