"""Lock-step: the simulator steps each frame with the VLA node's answer to that frame (pure
Python: no rclpy, no torch).

Frame k is stepped with the pair (`answer_pairing.AnswerPairs`) whose twist carries frame k's
stamp; pairs answering other frames (late or duplicate answers) are counted, never applied.
With a chunked model that is the first step the node publishes for frame k (step 0, or the
step due when the chunk arrived); the chunk's later steps arrive on the node's clock and are
counted as other answers. `vla-spec demo` refuses lock-step for chunked models for that
reason (one step per frame is not the chunk's plan); its delay part executes chunks
time-aligned in process (`delayed_lockstep`), and real time (`realtime_clock`) executes them as
the node publishes them. A frame may be published again `max_republish` times, then the
episode fails (`should_republish`): a held answer (e.g. an invalid token) repeats for the same
frame.

Which of the matched actions is applied at which control period when the action is delayed
(`action_delay` > 0) is `delayed_lockstep.DelayedLockstep`'s part.
"""
from __future__ import annotations

from vla_spec_ros.sim.answer_pairing import AnswerPairs, MatchedCommand
from vla_spec_ros.validation import check_int


class LockstepMatcher:
    """The current frame's command out of the node's answers, plus the republication budget.

    One matcher serves the node's whole life (its `AnswerPairs` must not be emptied); the
    counters restart with `begin_episode`.
    """

    def __init__(self, answers: AnswerPairs, max_republish: int = 3):
        self._answers = answers
        self._max_republish = check_int('max_republish', max_republish, minimum=0)
        self._current: int | None = None
        self.num_republished = 0       # republications of the current frame
        # This episode's answers not applied: to other frames (late, duplicate) or non-finite.
        self.num_other_answers = 0

    def begin_episode(self) -> None:
        self.num_other_answers = 0

    def begin_frame(self, stamp_ns: int) -> None:
        """A new frame (not a republication) waits for its command. Call before publishing."""
        if stamp_ns not in self._answers.registry:
            raise ValueError(f'stamp_ns: {stamp_ns} was not added to the registry')
        self._current = stamp_ns
        self.num_republished = 0

    def end(self) -> None:
        """No frame waits for a command (episode over)."""
        self._current = None

    def should_republish(self) -> bool:
        """The current frame's command is overdue: True = publish the frame again (counted),
        False = `max_republish` republications did not help; the episode should fail."""
        if self.num_republished >= self._max_republish:
            return False
        self.num_republished += 1
        return True

    def on_twist(self, stamp_ns: int, linear, angular) -> bool:
        """Record a twist; True when it answers a published frame (and so has a gripper)."""
        return self._answers.on_twist(stamp_ns, linear, angular)

    def on_gripper(self, position: float) -> None:
        self._answers.on_gripper(position)

    def take(self) -> MatchedCommand | None:
        """The current frame's command once its twist and gripper have both arrived (at most
        once per frame); every other complete pair is counted in `num_other_answers`."""
        command = None
        for pair in self._answers.pop():
            if self._current is not None and pair.stamp_ns == self._current and pair.is_finite:
                command, self._current = pair, None
            else:
                self.num_other_answers += 1
        return command


__all__ = ['LockstepMatcher']
