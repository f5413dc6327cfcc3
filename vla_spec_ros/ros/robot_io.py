"""What one robot reads besides its images and what it sends: the lists of its input and output
adapters (input_adapter.py, output_adapter.py). Adding an input or an output is one class in
its own file and one line here; robot_channel.py builds a robot from these lists.
"""
from __future__ import annotations

from vla_spec_ros.ros.gripper_output import GripperOutput
from vla_spec_ros.ros.pose_output import PoseTargetOutput
from vla_spec_ros.ros.raw_action_output import RawActionOutput
from vla_spec_ros.ros.reasoning_output import ReasoningOutput
from vla_spec_ros.ros.twist_output import TwistOutput


def build_inputs(node, prefix: str, settings, get_settings) -> list:
    """The robot's paired inputs (input_adapter.py), read in this order at each observation:
    the robot state of `state_input` (state_input.py). `get_settings()`: the robot's
    NodeSettings in force."""
    inputs = []
    if settings.state_input == 'joint_state':
        from vla_spec_ros.ros.state_input import JointStateInput

        inputs.append(JointStateInput(node, prefix, get_settings))
    elif settings.state_input == 'array':
        from vla_spec_ros.ros.state_input import ArrayStateInput

        inputs.append(ArrayStateInput(node, prefix, get_settings))
    return inputs


def build_outputs(node, prefix: str, settings, label: str, *, is_chunked: bool,
                  current_positions=None, writes_reasoning: bool = False) -> list:
    """The robot's output adapters, in publishing order (output_adapter.py): the action
    space's own first (`action_space`, docs/action_spaces.md), then the gripper and the raw
    action, then pose targets, then a reasoning policy's text. `current_positions(settings)`:
    the measured joint positions (the joint-position hold, joint_outputs.py)."""
    def primary():
        if settings.action_space == 'joint_velocity':
            from vla_spec_ros.ros.joint_outputs import JointJogOutput

            return JointJogOutput(node, prefix)
        if settings.action_space == 'joint_position':
            from vla_spec_ros.ros.joint_outputs import JointTrajectoryOutput

            return JointTrajectoryOutput(node, prefix, current_positions or (lambda s: None))
        return TwistOutput(node, prefix, is_chunked=is_chunked)

    makers = [primary, lambda: GripperOutput(node, prefix, settings, label),
              lambda: RawActionOutput(node, prefix)]
    if settings.pose_targets:
        makers.append(lambda: PoseTargetOutput(node, prefix, settings, label,
                                               is_chunked=is_chunked))
    if writes_reasoning:
        makers.append(lambda: ReasoningOutput(node, prefix))
    outputs = []
    try:
        for make in makers:
            outputs.append(make())
    except Exception:        # one cannot be built (a missing package): none is left behind
        for output in outputs:
            output.destroy()
        raise
    return outputs


__all__ = ['build_inputs', 'build_outputs']
