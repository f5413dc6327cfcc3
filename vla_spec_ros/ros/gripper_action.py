"""Gripper goals for the ros2_control gripper controllers (control_msgs actions).

`gripper_action_type` picks the action the robot's controller serves:
  gripper_command   control_msgs/action/GripperCommand (the GripperActionController):
                    goal.command.position, goal.command.max_effort = gripper_max_effort
  parallel_gripper  control_msgs/action/ParallelGripperCommand (ros2_controllers'
                    parallel_gripper_action_controller, which replaces the former):
                    goal.command is a sensor_msgs/JointState with name [gripper_joint_name]
                    (empty when unset), position [position], effort [gripper_max_effort]
                    (the largest effort allowed while moving), no velocity (not limited)

A goal is sent when the mapped gripper position changes (command_rules.gripper_position), never
on a hold (the controller keeps its last goal). A goal that did not do its work is sent again
with the next command for that position: one the server rejected or that ended otherwise than
succeeded (aborted, canceled; the controller aborts on a stall unless it allows stalling), one
lost to a server that went away, one unanswered (no result) RESULT_TIMEOUT_S after it was
sent, and one after a hold (`forget`: something else may have moved the gripper meanwhile).
A server that went away is seen two ways. Stopped cleanly, it is not ready while it is gone,
and nothing is remembered as sent meanwhile. Killed outright (SIGKILL, a crash, then
`respawn: true`), its endpoints stay in DDS discovery until their lease runs out (20 s with
Fast DDS's defaults), so the client still finds a server ready and the goal it had is lost
with it: as for MoveIt Servo (servo_presence.py), the GIDs of the request readers of the
action's `<action>/_action/send_goal` service tell the instances apart, and a GID not listed
at the previous command is a new server that knows no goal of ours. Only the latest goal's
fate counts: a goal replaced by a newer one (which preempts it at the controller) changes
nothing when it ends. Each such case is logged (throttled) and the last goal's fate is in
/diagnostics (`gripper_action`), the new servers seen in `gripper_action_restarts`.
control_msgs is imported here only: where it is missing one warning says so and the node
publishes ~/gripper alone.
"""
from __future__ import annotations

import threading
import time

from vla_spec_ros.ros.late_callbacks import tolerating_destroyed
from vla_spec_ros.ros.servo_presence import server_gids

GRIPPER_ACTION_TYPES = ('gripper_command', 'parallel_gripper')
LOG_THROTTLE_S = 2.0
# A goal sent this long ago without a result is taken as lost (a server killed after it took
# the goal never answers, and a request sent before a respawned server matched the client
# never arrives). A gripper opens or closes within about a second, and a GripperActionController
# ends a goal that stops moving after its stall_timeout (1 s by default); sending the same goal
# again to a server that still runs it only replaces it with an identical one.
RESULT_TIMEOUT_S = 5.0


def _action_type(kind: str):
    """The control_msgs action class of `kind`; ImportError where control_msgs (or this
    action, older than Humble's control_msgs 4) is missing."""
    if kind == 'parallel_gripper':
        from control_msgs.action import ParallelGripperCommand
        return ParallelGripperCommand
    from control_msgs.action import GripperCommand
    return GripperCommand


class GripperActionOutput:
    """One robot's gripper action client (see the module docstring); `send(position,
    settings)` from any thread."""

    def __init__(self, node, action_name: str, kind: str, label: str):
        if kind not in GRIPPER_ACTION_TYPES:
            raise ValueError(f'gripper_action_type: {kind!r} not in {list(GRIPPER_ACTION_TYPES)}')
        self.node, self.label, self.kind = node, label, kind
        self.action_name = action_name
        self._lock = threading.Lock()     # send (worker) against the goal callbacks (executor)
        self._last_goal: float | None = None
        self._goal_number = 0             # of the latest goal sent: only its fate counts
        self._sent_at: float | None = None   # monotonic; None once the latest goal ended
        self._servers = frozenset()       # server GIDs at the previous command (docstring)
        self._send_goal_service: str | None = None
        self.num_restarts = 0             # new servers seen, for /diagnostics
        self.state = 'no goal sent'       # the last goal's fate, for /diagnostics
        self.client = None
        try:
            self._type = _action_type(kind)
            from rclpy.action import ActionClient
        except ImportError:
            node.get_logger().warning(
                f'{label}: gripper_action_name {action_name!r} set but control_msgs\' '
                f'{kind} action is not importable; only the gripper topic is published')
            return
        self.client = ActionClient(node, self._type, action_name)
        # The name rcl_action resolves the action to (namespace, remapping), as a service.
        self._send_goal_service = f'{node.resolve_topic_name(action_name)}/_action/send_goal'

    def send(self, position: float, settings) -> None:
        """A goal for `position` when it differs from the last goal sent and not known lost
        (module docstring)."""
        client = self.client
        if client is None:
            return
        if not client.server_is_ready():
            with self._lock:          # a server that comes back knows no goal of ours
                self._forget_goal()
                self._servers = frozenset()
                self.state = f'server {self.action_name} not ready'
            self.node.get_logger().warning(
                f'{self.label}: {self._type.__name__} server {self.action_name} not ready',
                throttle_duration_sec=LOG_THROTTLE_S)
            return
        servers = (server_gids(self.node, self._send_goal_service)
                   if self._send_goal_service else frozenset())
        now = time.monotonic()
        with self._lock:
            lost = self._lost(servers, now)
            is_new = position != self._last_goal
            if is_new:
                self._last_goal = position
                self._goal_number += 1
                self._sent_at = now
                self.state = f'goal {position:.4f} sent' + (f' again: {lost}' if lost else '')
            number = self._goal_number
        if lost:
            self.node.get_logger().warning(
                f'{self.label}: {lost}; the gripper goal is sent again',
                throttle_duration_sec=LOG_THROTTLE_S)
        if not is_new:
            return
        goal = self._type.Goal()
        if self.kind == 'parallel_gripper':
            joint = settings.gripper_joint_name
            goal.command.name = [joint] if joint else []
            goal.command.position = [float(position)]
            goal.command.effort = [float(settings.gripper_max_effort)]
        else:
            goal.command.position = float(position)
            goal.command.max_effort = float(settings.gripper_max_effort)
        client.send_goal_async(goal).add_done_callback(tolerating_destroyed(
            lambda future: self._on_response(future, position, number)))

    def _lost(self, servers: frozenset, now: float) -> str | None:
        """(Under the lock.) Why the last goal sent is lost, forgetting it (the next goal goes
        out whatever it was), or None. `servers`: the server GIDs listed now. The first GIDs
        listed are not a new server (the graph may list them a moment after the server is
        ready); a GID not listed at the previous command is."""
        known, self._servers = self._servers, servers
        if known and servers - known:
            self.num_restarts += 1
            why = f'gripper action server {self.action_name} restarted'
        elif self._sent_at is not None and now - self._sent_at > RESULT_TIMEOUT_S:
            why = (f'gripper goal {self._last_goal:.4f} unanswered by {self.action_name} '
                   f'after {RESULT_TIMEOUT_S:g} s')
        else:
            return None
        self._forget_goal()
        return why

    def forget(self) -> None:
        """The next command sends its goal whatever the last one was (after a hold)."""
        with self._lock:
            self._forget_goal()

    def _forget_goal(self) -> None:
        """(Under the lock.) No goal is remembered as sent, nor awaited (`_sent_at` is set
        only with `_last_goal`)."""
        self._last_goal = self._sent_at = None

    def _is_latest(self, number: int) -> bool:
        """(Under the lock.) Whether goal `number` is the latest sent: an older one was
        replaced (the controller preempts it) or given up as lost, and its end says nothing of
        the gripper's state."""
        return number == self._goal_number

    def _on_response(self, future, position: float, number: int) -> None:
        try:
            handle = future.result()
        except Exception:             # the server went away before it answered
            handle = None
        if handle is None or not handle.accepted:
            self._failed(position, number, 'rejected')
            return
        with self._lock:
            if not self._is_latest(number):
                return
            self.state = f'goal {position:.4f} accepted'
        handle.get_result_async().add_done_callback(tolerating_destroyed(
            lambda result: self._on_result(result, position, number)))

    def _on_result(self, future, position: float, number: int) -> None:
        from action_msgs.msg import GoalStatus
        try:
            status = future.result().status
        except Exception:
            status = GoalStatus.STATUS_UNKNOWN
        if status == GoalStatus.STATUS_SUCCEEDED:
            with self._lock:
                if self._is_latest(number):
                    self._sent_at = None
                    self.state = f'goal {position:.4f} succeeded'
            return
        names = {GoalStatus.STATUS_ABORTED: 'aborted', GoalStatus.STATUS_CANCELED: 'canceled'}
        self._failed(position, number, names.get(status, f'ended with status {status}'))

    def _failed(self, position: float, number: int, what: str) -> None:
        """A goal that did not do its work: sent again with the next command for it (the
        latest goal only; see `_is_latest`)."""
        with self._lock:
            if not self._is_latest(number):
                return
            self._forget_goal()
            self.state = f'goal {position:.4f} {what}'
        self.node.get_logger().warning(
            f'{self.label}: gripper goal {position:.4f} {what} by {self.action_name}; sent '
            'again with the next command', throttle_duration_sec=LOG_THROTTLE_S)

    def add_to_status(self, status) -> None:
        from diagnostic_msgs.msg import KeyValue
        with self._lock:
            state, restarts = self.state, self.num_restarts
        status.values.append(KeyValue(key='gripper_action', value=state))
        status.values.append(KeyValue(key='gripper_action_restarts', value=str(restarts)))

    def destroy(self) -> None:
        if self.client is not None:
            self.client.destroy()
            self.client = None


__all__ = ['GripperActionOutput', 'GRIPPER_ACTION_TYPES']
