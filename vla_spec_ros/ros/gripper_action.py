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
lost to a server that went away (while it is not ready, nothing is remembered as sent), and one
after a hold (`forget`: something else may have moved the gripper meanwhile). Each such case is
logged (throttled) and the last goal's fate is in /diagnostics (`gripper_action`).
control_msgs is imported here only: where it is missing one warning says so and the node
publishes ~/gripper alone.
"""
from __future__ import annotations

import threading

GRIPPER_ACTION_TYPES = ('gripper_command', 'parallel_gripper')
LOG_THROTTLE_S = 2.0


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

    def send(self, position: float, settings) -> None:
        """A goal for `position` when it differs from the last goal sent (module
        docstring)."""
        client = self.client
        if client is None:
            return
        if not client.server_is_ready():
            with self._lock:          # a server that comes back knows no goal of ours
                self._last_goal = None
                self.state = f'server {self.action_name} not ready'
            self.node.get_logger().warning(
                f'{self.label}: {self._type.__name__} server {self.action_name} not ready',
                throttle_duration_sec=LOG_THROTTLE_S)
            return
        with self._lock:
            if position == self._last_goal:
                return
            self._last_goal = position
            self.state = f'goal {position:.4f} sent'
        goal = self._type.Goal()
        if self.kind == 'parallel_gripper':
            joint = settings.gripper_joint_name
            goal.command.name = [joint] if joint else []
            goal.command.position = [float(position)]
            goal.command.effort = [float(settings.gripper_max_effort)]
        else:
            goal.command.position = float(position)
            goal.command.max_effort = float(settings.gripper_max_effort)
        client.send_goal_async(goal).add_done_callback(
            lambda future, position=position: self._on_response(future, position))

    def forget(self) -> None:
        """The next command sends its goal whatever the last one was (after a hold)."""
        with self._lock:
            self._last_goal = None

    def _on_response(self, future, position: float) -> None:
        try:
            handle = future.result()
        except Exception:             # the server went away before it answered
            handle = None
        if handle is None or not handle.accepted:
            self._failed(position, 'rejected')
            return
        with self._lock:
            self.state = f'goal {position:.4f} accepted'
        handle.get_result_async().add_done_callback(
            lambda result, position=position: self._on_result(result, position))

    def _on_result(self, future, position: float) -> None:
        from action_msgs.msg import GoalStatus
        try:
            status = future.result().status
        except Exception:
            status = GoalStatus.STATUS_UNKNOWN
        if status == GoalStatus.STATUS_SUCCEEDED:
            with self._lock:
                self.state = f'goal {position:.4f} succeeded'
            return
        names = {GoalStatus.STATUS_ABORTED: 'aborted', GoalStatus.STATUS_CANCELED: 'canceled'}
        self._failed(position, names.get(status, f'ended with status {status}'))

    def _failed(self, position: float, what: str) -> None:
        """A goal that did not do its work: sent again with the next command for it."""
        with self._lock:
            if self._last_goal == position:
                self._last_goal = None
            self.state = f'goal {position:.4f} {what}'
        self.node.get_logger().warning(
            f'{self.label}: gripper goal {position:.4f} {what} by {self.action_name}; sent '
            'again with the next command', throttle_duration_sec=LOG_THROTTLE_S)

    def add_to_status(self, status) -> None:
        from diagnostic_msgs.msg import KeyValue
        with self._lock:
            state = self.state
        status.values.append(KeyValue(key='gripper_action', value=state))

    def destroy(self) -> None:
        if self.client is not None:
            self.client.destroy()
            self.client = None


__all__ = ['GripperActionOutput', 'GRIPPER_ACTION_TYPES']
