"""Output adapter of the end-effector delta action space: TwistStamped, and a chunk's
velocities as a MultiDOFJointTrajectory (output_adapter.py).

  <prefix>twist                 geometry_msgs/TwistStamped per command (or chunk step),
                                stamped with the observation's stamp (a chunk's step i: + i
                                control periods), frame_id from the parameter; a hold is a
                                zero twist stamped now
  <prefix>velocity_trajectory   chunked models, where trajectory_msgs is importable: each
                                chunk once, on arrival (twist_messages.trajectory_message),
                                built and sent only while someone subscribes to it (the
                                chunk's first twist waits for this call: with nobody
                                listening it is skipped, ~0.3 ms of the worker per chunk);
                                on the first hold after one, the stop: one point of zero
                                velocity one control period after the hold's time
                                (twist_messages.stop_trajectory_message; a trajectory
                                controller rejects an empty trajectory)
  <prefix>trajectory            the former name of velocity_trajectory, the same messages
                                (also sent only while subscribed)
"""
from __future__ import annotations

from geometry_msgs.msg import TwistStamped

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros import twist_messages
from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.qos import COMMAND_QOS
from vla_spec_ros.ros.twist_messages import (stop_trajectory_message, trajectory_message,
                                             twist_message)


class TwistOutput(OutputAdapter):
    def __init__(self, node, prefix: str, *, is_chunked: bool):
        self.node = node
        self.twist_pub = node.create_publisher(TwistStamped, prefix + 'twist', COMMAND_QOS)
        # A chunk's velocities; `trajectory` is the topic's former name, kept as an alias.
        self.trajectory_pub = self.legacy_trajectory_pub = None
        trajectory_type = twist_messages.MultiDOFJointTrajectory
        if is_chunked and trajectory_type is not None:
            self.trajectory_pub = node.create_publisher(
                trajectory_type, prefix + 'velocity_trajectory', COMMAND_QOS)
            self.legacy_trajectory_pub = node.create_publisher(
                trajectory_type, prefix + 'trajectory', COMMAND_QOS)
        self._trajectory_live = False     # a trajectory was sent and not stopped yet
        self._chunk = None                # (the chunk last sent whole, its commands)

    def command_publishers(self) -> list:
        return [self.twist_pub, self.trajectory_pub, self.legacy_trajectory_pub]

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        self.twist_pub.publish(twist_message(command.linear, command.angular, stamp,
                                             settings.frame_id))

    def publish_chunk(self, chunk, commands, settings, prepared=None) -> None:
        self._chunk = (chunk, list(commands))
        listened = self._listened_trajectory_pubs()
        if not listened:
            return
        msg = trajectory_message(commands, chunk.stamp, settings.frame_id, chunk.period_s)
        for pub in listened:
            pub.publish(msg)
        self._trajectory_live = True

    def publish_step(self, chunk, index: int, command, stamp, settings) -> None:
        """The step's twist; and when a hold stopped the chunk's velocity trajectory (one
        step refused, the chunk kept), the chunk's rest again from this step (its due command
        first), on the chunk's own times."""
        self.publish_command(command, stamp, settings)
        kept = self._chunk
        if self._trajectory_live or kept is None or kept[0] is not chunk:
            return
        listened = self._listened_trajectory_pubs()
        if listened:
            rest = [command] + kept[1][index + 1:]
            msg = trajectory_message(rest, stamp, settings.frame_id, chunk.period_s)
            for pub in listened:
                pub.publish(msg)
            self._trajectory_live = True

    def _listened_trajectory_pubs(self) -> list:
        """The trajectory topics with a matched subscription now. A subscriber that matches
        later gets the next chunk, as one that missed this chunk in transit would."""
        return [pub for pub in (self.trajectory_pub, self.legacy_trajectory_pub)
                if pub is not None and pub.get_subscription_count() > 0]

    def hold(self, stamp, settings) -> None:
        self.twist_pub.publish(twist_message(cmd.ZERO3, cmd.ZERO3, stamp, settings.frame_id))
        if self._trajectory_live and self.trajectory_pub is not None:
            # Zero velocity one period ahead: a stop a trajectory controller accepts.
            self._trajectory_live = False
            self._publish_trajectory(stop_trajectory_message(stamp, settings.frame_id,
                                                             settings.control_period))

    def _publish_trajectory(self, msg) -> None:
        """The stop goes to both topics: whoever received a trajectory must get it."""
        self.trajectory_pub.publish(msg)
        self.legacy_trajectory_pub.publish(msg)

    def destroy(self) -> None:
        for pub in (self.twist_pub, self.trajectory_pub, self.legacy_trajectory_pub):
            if pub is not None:
                self.node.destroy_publisher(pub)


__all__ = ['TwistOutput']
