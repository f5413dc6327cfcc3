"""A reasoning policy's text on ``~/reasoning``, per robot, for every answered frame.

A reasoning policy (ECoT, docs/reasoning.md) writes its plan, subtask, move and what it sees
before its action. The node publishes it as std_msgs/String holding one JSON object (ROS 2 has
no stamped string; JSON keeps the parsed fields without a custom interface package):

    {"stamp": {"sec": ..., "nanosec": ...},   the twist's (command_rules.command_stamp)
     "text": "TASK: ... GRIPPER POSITION: [...]",
     "fields": {"task": ..., "plan": ..., "move": ..., ...},
     "objects": [[name, [x1, y1, x2, y2]], ...], "gripper": [[x, y], ...],
     "num_tokens": ...,        tokens the frame generated (reasoning, marker and action;
                               a reused text's tokens are not counted: they were not
                               generated for this frame)
     "forward_passes": ...,    verifier forwards the frame took
     "reasoning_reused": ...,  true when the text is an earlier frame's, reused unverified
                               (``reasoning_every_n`` > 1), false when reasoned afresh
     "action_valid": true | false, "invalid_reason": null | "..."}

It goes out for every frame the engine answered while it was still current, acted on or not
(a frame refused for having no action within ``max_reasoning_tokens`` still says what it
thought), before the channel's safety decision; a frame superseded meanwhile (a reset, a new
instruction, a clock jump) is dropped with its text. It never moves the robot. /diagnostics
gains ``reasoning_tokens`` and ``reasoning_forwards`` (the last frame's) and their means over
the frames published.
"""
from __future__ import annotations

import json

from std_msgs.msg import String

from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.qos import COMMAND_QOS


def generated_tokens(result) -> int:
    """Tokens the frame generated: its output less a reused reasoning it was forced to
    begin with."""
    return len(result.tokens) - int(result.stats.get('num_forced', 0))


def reasoning_json(result, stamp) -> str:
    """The JSON text of one finished frame's reasoning (module docstring)."""
    reasoning = result.reasoning
    return json.dumps({
        'stamp': {'sec': int(stamp.sec), 'nanosec': int(stamp.nanosec)},
        'text': reasoning.text, 'fields': dict(reasoning.fields),
        'objects': [[name, list(box)] for name, box in reasoning.objects],
        'gripper': [list(point) for point in reasoning.gripper],
        'num_tokens': generated_tokens(result),
        'forward_passes': int(result.stats.get('forward_passes', 0)),
        'reasoning_reused': bool(result.stats.get('reasoning_reused', False)),
        'action_valid': bool(result.is_valid), 'invalid_reason': result.invalid_reason})


class ReasoningOutput(OutputAdapter):
    """``~/reasoning`` of one robot (module docstring); holds and commands send nothing."""

    def __init__(self, node, prefix: str):
        self.publisher = node.create_publisher(String, prefix + 'reasoning', COMMAND_QOS)
        self._node = node
        self._last = (0, 0)
        self._totals = [0, 0, 0]           # frames, tokens, forwards

    def publish_reasoning(self, result, stamp) -> None:
        if result is None or result.reasoning is None:
            return
        self.publisher.publish(String(data=reasoning_json(result, stamp)))
        forwards = int(result.stats.get('forward_passes', 0))
        self._last = (generated_tokens(result), forwards)
        self._totals = [self._totals[0] + 1, self._totals[1] + self._last[0],
                        self._totals[2] + forwards]

    def add_to_status(self, status) -> None:
        from diagnostic_msgs.msg import KeyValue

        frames, tokens, forwards = self._totals
        values = {'reasoning_tokens': self._last[0], 'reasoning_forwards': self._last[1],
                  'reasoning_tokens_mean': tokens / frames if frames else float('nan'),
                  'reasoning_forwards_mean': forwards / frames if frames else float('nan')}
        status.values.extend(KeyValue(key=k, value=f'{v:.1f}' if isinstance(v, float)
                                      else str(v)) for k, v in values.items())

    def destroy(self) -> None:
        self._node.destroy_publisher(self.publisher)


__all__ = ['ReasoningOutput', 'reasoning_json']
