"""The interface every output of a robot implements: one adapter per thing the node sends.

A robot channel (robot_channel.py) decides *whether* to act (safety_gate.py, command_rules.py,
chunk_rules.py) and then hands the decided commands to its adapters, in order; each adapter
decides *what goes on the wire*. Adding an output (a new action space, a new controller's
message) is one new file with one `OutputAdapter` subclass, and one line in
`robot_io.build_outputs`.

The calls, all optional (the base class does nothing), each with the robot's NodeSettings in
force:

  prepare(observation_s, settings) -> (prepared, hold_reason)
        Before a result is acted on: what this output needs from the world at the
        observation's time (node clock seconds); `prepared` is passed back to
        publish_command / publish_chunk. A non-None `hold_reason` means the command cannot be
        computed (pose targets: tool pose unknown): the robot holds with that reason instead.
  publish_command(command, stamp, settings, prepared)
        A single-step model's decided command (command_rules.Command), stamped `stamp` (the
        observation's header stamp, builtin_interfaces/Time).
  publish_chunk(chunk, commands, settings, prepared)
        A chunked model's chunk on arrival (chunk_rules.Chunk and its K decided commands):
        the whole chunk at once, for outputs that send trajectories.
  publish_step(chunk, index, command, stamp, settings)
        Step `index` of `chunk`, due now on the control clock (`command`: after blending and
        the step's own safety decision; `stamp` = the chunk's stamp + index periods). The
        default calls publish_command(command, stamp, settings, None).
  hold(stamp, settings)
        The robot must not move: send this output's hold (a zero twist, a zero JointJog,
        "stay" for a position controller, a stopped trajectory; nothing for a gripper, which
        keeps its last goal). Called by the channel when the safety gate says so; never
        decide here whether to hold.
  command_publishers()     the publishers of this output's motion commands (for the
                           /diagnostics check that something receives them:
                           command_listeners.py); none for outputs that do not move the arm
  add_to_status(status)    extra /diagnostics values (diagnostic_msgs KeyValue)
  forget()                 the node clock went back (clock_jumps.py): drop what was kept on
                           the old time line (a trajectory sent, a pose measured), before
                           the hold that follows, so that hold does not go to an old target
  destroy()                remove this adapter's ROS entities

Threads: publish_command and prepare run on the inference worker; publish_step on the step
clock; publish_chunk on the worker; hold on any of them or on the executor. The channel
serialises chunk and step calls under its chunk lock; an adapter that keeps state between
calls must guard it.

Adapters publish only what they are given: commands are already finite, scaled and clamped.
"""
from __future__ import annotations


class OutputAdapter:
    """Base class: every call is a no-op (see the module docstring for the contract)."""

    def prepare(self, observation_s: float, settings):
        return None, None

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        pass

    def publish_chunk(self, chunk, commands, settings, prepared=None) -> None:
        pass

    def publish_step(self, chunk, index: int, command, stamp, settings) -> None:
        self.publish_command(command, stamp, settings, None)

    def hold(self, stamp, settings) -> None:
        pass

    def command_publishers(self) -> list:
        return []

    def add_to_status(self, status) -> None:
        pass

    def forget(self) -> None:
        pass

    def destroy(self) -> None:
        pass


__all__ = ['OutputAdapter']
