"""What the simulator bridge records about one episode (pure Python: no rclpy, no torch).

`EpisodeCounters` counts the episode's steps, frames, applied / stale / held commands, answers
not applied, republications, answer lags (`realtime_clock.answer_lag`) and late ticks;
`EpisodeLog` holds the counters with the applied actions, the first-answer latencies, the wall
time, the result (`sim.demos.EpisodeResult`, None while the episode runs) and why it ended (one
of the END_* reasons, '' while it runs). The bridge node fills them; the closed-loop harness
reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Why an episode ended (EpisodeLog.end_reason).
END_SUCCESS, END_MAX_STEPS, END_TIMEOUT = 'success', 'max_steps', 'timeout'
END_UNANSWERED, END_STOPPED = 'unanswered', 'stopped'


@dataclass
class EpisodeCounters:
    num_steps: int = 0
    num_frames_published: int = 0       # republications included
    num_commands_applied: int = 0       # steps taken with a received command
    num_stale_commands: int = 0         # real time: steps with zero motion (stale / missing);
    #                                     delayed lock-step: steps with a held action
    num_republished_frames: int = 0     # lock-step: frames sent again after a timeout
    num_other_answers: int = 0          # answers not applied: lock-step, to other frames;
    #                                     real time, to an earlier episode's frames
    is_timed_out: bool = False          # episode_timeout_s / run_episode's timeout
    is_unanswered: bool = False         # lock-step: a frame unanswered after max_republish
    num_hold_commands: int = 0          # real time: steps with a hold twist (zero, no frame)
    # Real time, steps applying an answer: lag = the step's control period - (its frame's
    # period + its chunk step), i.e. how many periods after the state it was planned for it
    # was applied (0: time-aligned; a single-step answer to a frame d periods old: >= d).
    num_answer_steps: int = 0
    answer_lag_sum: int = 0
    num_answer_steps_on_time: int = 0   # lag 0
    num_answer_steps_early: int = 0     # lag < 0 (a late tick took the next slot's step)
    num_late_ticks: int = 0             # real time: ticks > LATE_TICK_PERIODS after the last
    max_tick_gap_s: float = 0.0         # real time: the longest time between two ticks


@dataclass
class EpisodeLog:
    """Everything recorded about one episode; `result` is None while it runs."""

    counters: EpisodeCounters = field(default_factory=EpisodeCounters)
    applied_actions: list = field(default_factory=list)    # (7,) float64 per step
    latencies_s: list = field(default_factory=list)        # frame published -> first answer
    wall_s: float = 0.0
    result: object = None                                  # sim.demos.EpisodeResult
    end_reason: str = ''                                   # END_*; '' while it runs


__all__ = ['END_SUCCESS', 'END_MAX_STEPS', 'END_TIMEOUT', 'END_UNANSWERED', 'END_STOPPED',
           'EpisodeCounters', 'EpisodeLog']
