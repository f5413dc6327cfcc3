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
on a hold (the controller keeps its last goal). control_msgs is imported here only: where it is
missing one warning says so and the node publishes ~/gripper alone.
"""
from __future__ import annotations

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
        self._last_goal: float | None = None
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
        """A goal for `position` when it differs from the last goal sent."""
        client = self.client
        if client is None or position == self._last_goal:
            return
        if not client.server_is_ready():
            self.node.get_logger().warning(
                f'{self.label}: {self._type.__name__} server {self.action_name} not ready',
                throttle_duration_sec=LOG_THROTTLE_S)
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
        client.send_goal_async(goal)
        self._last_goal = position

    def destroy(self) -> None:
        if self.client is not None:
            self.client.destroy()
            self.client = None


__all__ = ['GripperActionOutput', 'GRIPPER_ACTION_TYPES']
