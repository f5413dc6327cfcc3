"""Output adapter of `pose_targets: true`: absolute tool targets (pose_targets.py) behind the
OutputAdapter interface (output_adapter.py).

prepare() reads the tool pose at the observation's time (no pose: the robot holds with
`no tool pose`); publish_command / publish_chunk apply the decided deltas to it; a chunk
step publishes the target kept for that chunk's step; a hold stops ~/pose_trajectory.
"""
from __future__ import annotations

from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.pose_targets import PoseTargetOutput


class PoseTargetAdapter(OutputAdapter):
    def __init__(self, node, prefix: str, settings, label: str, *, is_chunked: bool):
        self.output = PoseTargetOutput(node, prefix, settings, label, is_chunked=is_chunked)

    def prepare(self, observation_s: float, settings):
        return self.output.start_pose(observation_s, settings)

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        if prepared is not None:
            self.output.publish_action(prepared, command, stamp, settings)

    def publish_chunk(self, chunk, commands, settings, prepared=None) -> None:
        if prepared is not None:
            self.output.add_chunk(chunk, prepared, commands, chunk.stamp, settings)

    def publish_step(self, chunk, index: int, command, stamp, settings) -> None:
        self.output.publish_step(chunk, index, stamp)

    def hold(self, stamp, settings) -> None:
        self.output.stop(stamp, settings)

    def destroy(self) -> None:
        self.output.destroy()


__all__ = ['PoseTargetAdapter']
