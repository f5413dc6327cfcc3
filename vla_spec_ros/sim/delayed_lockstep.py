"""Delayed lock-step: which action a lock-step episode applies at each control period, single
actions and action chunks alike (numpy only: no rclpy, no torch).

Delayed lock-step (`DelayedLockstep`, lock-step with `action_delay` d > 0): still lock-step
(every answer is awaited, so a run is deterministic and independent of the machine's speed),
but the action decided from the frame of control period k is applied at period k + d, as if
inference took d periods. Until it lands the arm holds (`delay_hold`): the previous applied
action, or zero motion (the gripper keeps its last value either way; before the first answer:
zero motion, gripper open). `delay_frames` says which frames reach the policy: "every" (a
pipelined policy: every period's frame is answered, each d periods later) or "one_in_flight"
(a policy that takes a new frame only when the previous answer has landed: the frames of
periods 0, d, 2d, ...; each answer then holds for d periods). d = 0 is plain lock-step. The
same object drives the bridge node and the in-process episode loop (`sim.demos.run_episode`),
so both apply the same actions at the same periods.

Action chunks (a policy answering a (K, 7) plan per frame, docs/chunks.md): the delayed lock-step
executes a chunk on the control clock, time-aligned, like the VLA node does. Step i of the chunk
decided from period t's frame is due at period t + i (`chunk_step_due`); the chunk lands at
period t + d, so its steps 0 .. d-1 are past and skipped and step d is applied first. The newest
chunk that has landed wins (the node's `chunk_blend: latest`): an older chunk's remaining steps
are dropped. When the newest chunk has no step left (it ran out, or d >= K so every step was
past when it landed), the arm holds as above (`delay_hold`). A (7,) answer keeps the
single-step rule: it is applied when it lands, whatever d. With d = 0 and every frame answered
a chunked policy applies step 0 of each chunk (a new chunk every period); with one frame in
flight it applies steps d .. 2d-1 of each chunk (those before the next chunk lands), holding
for the ones beyond K - 1.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from vla_spec_ros.sim.bridge_settings import check_delay
from vla_spec_ros.sim.twist_to_action import ACTION_DIM


def chunk_step_due(frame_period: int, num_steps: int, period: int) -> int | None:
    """The step of a chunk decided from `frame_period`'s frame that is due at `period` (step i
    covers period frame_period + i), or None when that period lies before the chunk or after its
    last step."""
    index = period - frame_period
    return index if 0 <= index < num_steps else None


class DelayedLockstep:
    """Which action a lock-step episode applies at each control period (module doc).

    Per period t, in order: `wants_frame(t)`; if True, the policy's action for period t's
    frame goes to `answer(t, action)`; then `action_at(t)` is the action to step with, and
    whether it is a fresh answer (False: a hold). Actions are 7-dim (deltas per step,
    absolute gripper in [0, 1]), or (K, 7) chunks executed time-aligned (module doc; a chunk's
    step counts as fresh). `source` tells where the last `action_at` came from: (frame period,
    step index) of the chunk step applied, (frame period, None) for a single action, None for a
    hold. A frame without a valid answer never reaches this object:
    lock-step ends that episode (the bridge after `max_republish` republications, the
    in-process loop at once).
    """

    def __init__(self, action_delay: int = 0, delay_hold: str = 'previous',
                 delay_frames: str = 'every', initial_gripper: float = 1.0):
        self.action_delay = check_delay(action_delay, delay_hold, delay_frames)
        self.delay_hold, self.delay_frames = delay_hold, delay_frames
        self._initial_gripper = float(initial_gripper)
        self.begin_episode()

    def begin_episode(self) -> None:
        self._pending: deque = deque()   # (period the answer lands, frame period, answer)
        self._last = np.r_[np.zeros(ACTION_DIM - 1), self._initial_gripper]
        self._chunk: tuple | None = None   # (frame period, (K, 7) steps): the newest landed
        self._next_period = 0
        self.num_fresh = self.num_held = 0
        self.num_chunk_steps_skipped = 0     # chunk steps past when their chunk landed
        self.num_chunks_replaced = 0         # chunks that landed with steps still due
        self.num_run_outs = 0     # the newest chunk had no step left (ran out, or all past)
        self.source: tuple | None = None

    def wants_frame(self, period: int) -> bool:
        """Whether period t's frame goes to the policy."""
        d = self.action_delay
        return self.delay_frames == 'every' or d == 0 or period % d == 0

    def answer(self, period: int, action) -> None:
        """The policy's answer for period t's frame (a wanted one, before `action_at(t)`): a
        (7,) action or a (K, 7) chunk."""
        if period != self._next_period or not self.wants_frame(period):
            raise ValueError(f'period: {period} is not the current period '
                             f'{self._next_period} or its frame was not wanted')
        if self._pending and self._pending[-1][0] >= period + self.action_delay:
            raise ValueError(f'period: {period} was answered already')
        action = np.array(action, dtype=np.float64)
        if (action.shape[-1:] != (ACTION_DIM,) or action.ndim not in (1, 2) or action.size == 0
                or not np.all(np.isfinite(action))):
            raise ValueError(f'action: expected a finite ({ACTION_DIM},) action or (K, '
                             f'{ACTION_DIM}) chunk, got {action}')
        self._pending.append((period + self.action_delay, period, action))

    def action_at(self, period: int) -> tuple[np.ndarray, bool]:
        """(action applied at period t, is_fresh); call once per period, in order."""
        if period != self._next_period:
            raise ValueError(f'period: expected {self._next_period}, got {period}')
        if self.wants_frame(period) and not (
                self._pending and self._pending[-1][0] == period + self.action_delay):
            raise ValueError(f'period: {period}\'s frame was not answered')
        self._next_period += 1
        if self._pending and self._pending[0][0] == period:
            _, frame_period, action = self._pending.popleft()
            if action.ndim == 1:              # a single action: applied when it lands
                self._chunk = None
                return self._apply(action, (frame_period, None))
            if self._chunk is not None and chunk_step_due(
                    self._chunk[0], len(self._chunk[1]), period) is not None:
                self.num_chunks_replaced += 1
            self._chunk = (frame_period, action)
            self.num_chunk_steps_skipped += min(period - frame_period, len(action))
        if self._chunk is not None:
            frame_period, steps = self._chunk
            index = chunk_step_due(frame_period, len(steps), period)
            if index is not None:
                return self._apply(steps[index], (frame_period, index))
            self._chunk = None
            self.num_run_outs += 1
        self.num_held += 1
        self.source = None
        if self.delay_hold == 'zero':
            self._last = np.r_[np.zeros(ACTION_DIM - 1), self._last[ACTION_DIM - 1]]
        return self._last.copy(), False

    def _apply(self, action: np.ndarray, source: tuple) -> tuple[np.ndarray, bool]:
        self._last = action
        self.num_fresh += 1
        self.source = source
        return action.copy(), True


__all__ = ['chunk_step_due', 'DelayedLockstep']
