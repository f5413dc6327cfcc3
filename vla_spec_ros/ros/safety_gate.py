"""One robot's hold state machine: when the node sends a hold, and which results it drops.

Pure Python (no rclpy); the channel (robot_channel.py) asks it and publishes. The decision
whether one action or chunk may be acted on at all (enabled, engine error, invalid, not finite,
stale) is command_rules.decide_command / chunk_rules.decide_chunk; this file is what happens
around those decisions, in four distinct verbs:

  hold_state(reason)   a standing state says "do not move" (disabled, stale or missing input,
                       no instruction): the outputs' hold is sent `num_halt_messages` times on
                       entering the state, then the node goes quiet so it does not fight other
                       command sources. Returns whether to send now. The budget is per kind
                       of reason and lasts until the next command: two kinds that alternate
                       (a refused future-stamped frame, then the watchdog's stale hold, again
                       and again) do not start each other's budget anew.
  hold_now(reason)     one hold that must go out now, whatever was sent before (a result that
                       may not be acted on, a chunk that ran out, an engine failure,
                       deactivation). Always returns True.
  refuse(receipt)      a frame that will not be answered (bad input): besides its hold, no
                       result of an older frame of this robot is acted on after it
                       (`superseded_reason`).
  released()           a command was published: the next hold state starts its budget anew.

What a "hold" puts on the wire is each output adapter's business (output_adapter.py): a zero
twist, a zero JointJog, "stay where you are" for joint positions, nothing for the gripper.
"""
from __future__ import annotations

import math
import threading

from vla_spec_ros.ros import command_rules as cmd


class SafetyGate:
    """The hold state of one robot (see the module docstring); thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._hold_kind: str | None = None     # reason_kind of the hold state being sent
        self._holds_sent: dict[str, int] = {}  # per reason_kind, since the last command
        # Receipt time (time.monotonic) of this robot's newest frame refused as bad input:
        # a result for a frame received before it is not acted on.
        self._refused_receipt_mono = -math.inf

    def hold_state(self, reason: str, num_halt_messages: int) -> bool:
        """Whether a standing hold state's message goes out now (its budget not spent)."""
        return self._count(reason, budget=num_halt_messages)

    def hold_now(self, reason: str) -> bool:
        """A hold that always goes out (it still counts against its kind's budget)."""
        return self._count(reason, budget=None)

    def _count(self, reason: str, budget: int | None) -> bool:
        kind = cmd.reason_kind(reason)
        with self._lock:
            self._hold_kind = kind
            num_sent = self._holds_sent.get(kind, 0)
            if budget is not None and num_sent >= budget:
                return False
            self._holds_sent[kind] = num_sent + 1
        return True

    def released(self) -> None:
        """A command went out: the robot is no longer in a hold state."""
        with self._lock:
            self._hold_kind = None
            self._holds_sent.clear()

    @property
    def hold_kind(self) -> str | None:
        return self._hold_kind

    def refuse(self, receipt_mono: float) -> None:
        """A frame received at `receipt_mono` was refused: nothing older is acted on."""
        with self._lock:
            self._refused_receipt_mono = max(self._refused_receipt_mono, receipt_mono)

    def superseded_reason(self, receipt_mono: float, frame_instruction: str,
                          instruction: str) -> str | None:
        """Why a finished frame's result must not be acted on because something newer decided
        against it, or None: a frame of this robot received after it was refused, or the
        robot's instruction changed (or was cleared) since it was submitted."""
        if receipt_mono < self._refused_receipt_mono:
            return 'its image is older than a frame refused since'
        if frame_instruction != instruction:
            return 'the instruction changed since its frame was submitted'
        return None


__all__ = ['SafetyGate']
