"""Executing a chunked policy's action chunks on the controller's clock (docs/chunks.md).

A chunked checkpoint (``action_chunk`` K > 1) decides K control steps per frame. The node keeps
each robot's chunks here and, at the control rate, publishes the step whose time has come.
Pure Python + numpy, no rclpy: the rules are unit-tested with a fake clock.

The timing rule. A chunk's time base is t0, its image's time on the node clock (the header
stamp, or the receipt time with ``stamp_source: receipt`` or an unstamped driver; never later
than the image's arrival: command_rules.aged_from, the same time ``max_action_age`` measures
from), and P is the ``control_period`` in force when it arrived:

  - step i (0 <= i < K) is due during its slot [t0 + i*P, t0 + (i+1)*P);
  - the age of step i at time `now` is now - (t0 + i*P);
  - a step is decided at most once, only inside its slot; a step whose slot has passed before
    it could be published is skipped (counted, never published late);
  - a step is published only while its age <= max_action_age (the usual safety decision,
    command_rules.decide_command, with the step's age; inside its slot a step is younger than
    P, so this only bites when control_period > max_action_age);
  - a chunk is refused on arrival (zero twist, counted stale) when its image is older than
    max_action_age + (K - 1)*P: no step of it could pass the rule above. A stamp more than
    max_action_age in the future is refused as a clock mismatch, as for a single action.

Blending (``chunk_blend``): ``latest`` executes the newest chunk from its first due step on (an
older chunk's remaining steps are dropped); ``ensemble`` publishes, on the newest chunk's slot
grid, the weighted mean of the due step of every chunk still covering that time (ACT's temporal
ensemble), weights exp(-chunk_ensemble_decay * j), j = 0 for the newest chunk, 1 for the one
before, ... (a positive decay favours the newest prediction; ACT numbers its chunks from the
oldest, which is a negative decay here).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla_spec_ros.ros import command_rules as cmd

BLENDS = ('latest', 'ensemble')
# What a chunk that does not decode does to the chunks already kept (the node's
# `invalid_chunk`): `continue` keeps executing them (each step still checked for its age), `hold`
# drops them and holds.
INVALID_CHUNK_RULES = ('continue', 'hold')
# Slot arithmetic in periods: t0 + i*P computed in floats must count as slot i's start.
_SLOT_ROUNDING = 1e-9


@dataclass(frozen=True)
class Chunk:
    """One frame's K steps on the node clock."""

    actions: np.ndarray     # (K, 7) float64, un-normalised
    start_s: float          # t0: the image's time (node clock seconds)
    period_s: float         # P: control_period when the chunk arrived
    stamp: Any = None       # the steps' stamp base (command_rules.command_stamp); opaque here

    @property
    def num_steps(self) -> int:
        return len(self.actions)

    @property
    def end_s(self) -> float:
        return self.slot_start(self.num_steps)

    def slot_start(self, index: int) -> float:
        return self.start_s + index * self.period_s

    def step_at(self, now_s: float) -> int:
        """The index whose slot holds `now_s` (negative before the chunk, >= K after it)."""
        return math.floor((now_s - self.start_s) / self.period_s + _SLOT_ROUNDING)

    def step_age(self, index: int, now_s: float) -> float:
        return now_s - self.slot_start(index)


@dataclass(frozen=True)
class StepAction:
    """Duck-typed ActionResult of one step, for command_rules.decide_command."""

    action: np.ndarray
    is_valid: bool = True
    invalid_reason: str | None = None


@dataclass(frozen=True)
class DueStep:
    """A step to publish now (after the safety decision)."""

    chunk: Chunk            # the chunk on whose slot grid it lies (the newest)
    index: int              # its index in `chunk`
    action: np.ndarray      # (7,): the chunk's step, or the blend of every covering chunk's
    age_s: float            # the oldest contributing step's age
    num_skipped: int        # steps of `chunk` passed over since its last decided one
    num_blended: int = 1    # chunks that contributed


@dataclass(frozen=True)
class RunOut:
    """The newest chunk's last slot ended and no newer chunk arrived: hold."""

    chunk: Chunk
    num_skipped: int        # its steps that were never decided (their slots passed)


@dataclass(frozen=True)
class ChunkDecision:
    """The arrival check of one finished frame: a hold reason, or the chunk's actions."""

    hold_reason: str | None
    actions: np.ndarray | None = None       # (K, 7)
    commands: tuple = ()                    # K command_rules.Command, scaled and limited


def chunk_age_limit(num_steps: int, settings) -> float:
    """The oldest image a chunk of `num_steps` may come from (seconds): max_action_age plus
    the slots of its later steps."""
    return settings.max_action_age + (num_steps - 1) * settings.control_period


def decide_chunk(result, *, error: str | None, is_enabled: bool, age_s: float | None,
                 num_steps: int, settings, action_dim: int = cmd.ACTION_DIM) -> ChunkDecision:
    """The safety checks of a whole chunk when it arrives (the chunk form of
    command_rules.decide_command): disabled, engine error, invalid, wrong shape, not finite,
    stale or future image (chunk_age_limit), a step whose command overflows. Each published
    step then goes through command_rules.decide_command again, with its own age."""
    if not is_enabled:
        return ChunkDecision(cmd.REASON_DISABLED)
    if error is not None or result is None:
        return ChunkDecision(f'{cmd.REASON_ENGINE_ERROR}: {error or "no result"}')
    if not result.is_valid:
        return ChunkDecision(f'{cmd.REASON_INVALID}: {result.invalid_reason or "unspecified"}')
    actions = np.asarray(result.action, dtype=np.float64)
    if actions.shape != (num_steps, action_dim):
        return ChunkDecision(f'{cmd.REASON_INVALID}: chunk has shape {actions.shape}, '
                             f'expected ({num_steps}, {action_dim})')
    if not np.all(np.isfinite(actions)):
        bad = int(np.flatnonzero(~np.all(np.isfinite(actions), axis=1))[0])
        return ChunkDecision(f'{cmd.REASON_NON_FINITE}: step {bad} '
                             f'{np.array2string(actions[bad], precision=4)}')
    stale = cmd.freshness_reason(age_s, settings,
                                 max_age_s=chunk_age_limit(num_steps, settings))
    if stale is not None:
        return ChunkDecision(stale)
    commands = []
    for row in actions:
        command = cmd.decide_command(StepAction(row), error=None, is_enabled=True, age_s=0.0,
                                     settings=settings, action_dim=action_dim)
        if command.is_hold:
            return ChunkDecision(command.hold_reason)
        commands.append(command)
    return ChunkDecision(None, actions, tuple(commands))


@functools.lru_cache(maxsize=64)
def ensemble_weights(count: int, decay: float) -> np.ndarray:
    """Normalised weights exp(-decay * j), j = 0 (newest) .. count - 1. Cached (a few
    (count, decay) pairs occur while a decay is in force, and the step clock asks every
    step); the array returned is read-only."""
    exponents = -decay * np.arange(count, dtype=np.float64)
    weights = np.exp(exponents - exponents.max())          # no overflow for negative decay
    weights = weights / weights.sum()
    weights.flags.writeable = False
    return weights


def blend_steps(actions, decay: float) -> np.ndarray:
    """The ensemble of one slot: `actions` are the due steps of the chunks covering it, the
    newest first, weighted by `ensemble_weights`."""
    weights = ensemble_weights(len(actions), decay)
    return np.tensordot(weights, np.stack(actions), axes=1)


class ChunkSchedule:
    """One robot's chunks and which of the newest chunk's steps were decided.

    Not thread-safe: the robot's channel serialises `add`, `due` and `clear`.
    """

    def __init__(self):
        self._chunks: list[Chunk] = []     # by image time, the newest last
        self._decided = -1                 # last decided step index of the newest chunk
        self._ran_out = False

    @property
    def newest(self) -> Chunk | None:
        return self._chunks[-1] if self._chunks else None

    def __len__(self) -> int:
        return len(self._chunks)

    def clear(self) -> None:
        self._chunks.clear()
        self._decided, self._ran_out = -1, False

    def add(self, chunk: Chunk, now_s: float) -> tuple[bool, bool]:
        """Keep `chunk` as the newest; (accepted, replaced). A chunk whose image is older
        than the newest kept one is not accepted; one of the same time is (frames are handed
        over in order, so it is the later frame: two frames aged by one coarse /clock tick,
        or a camera ahead whose frames are both aged from their arrival). `replaced`: the
        previous newest chunk still had steps at or after `now_s` (in ``latest`` they are
        never published)."""
        newest = self.newest
        if newest is not None and chunk.start_s < newest.start_s:
            return False, False
        replaced = newest is not None and not self._ran_out and now_s < newest.end_s
        self._prune(now_s)
        self._chunks.append(chunk)
        self._decided, self._ran_out = -1, False
        return True, replaced

    def _prune(self, now_s: float) -> None:
        self._chunks = [c for c in self._chunks[:-1] if c.end_s > now_s] + self._chunks[-1:]

    def due(self, now_s: float, *, blend: str = 'latest', decay: float = 0.0,
            max_age_s: float = math.inf, per_period_dims: int = 0) -> DueStep | RunOut | None:
        """What to do at `now_s`: a step whose slot holds `now_s` and was not decided yet, the
        newest chunk's run-out (once), or None (nothing new). `max_age_s` bounds the age of
        an older chunk's step that joins an ensemble (the grid's own step is checked by the
        caller's safety decision). `per_period_dims`: how many leading values of a step are
        a displacement over its chunk's period (6 for ee_delta; 0 for joint velocities and
        positions): an older chunk's step joins an ensemble rescaled to the newest chunk's
        period, so a control_period changed between them does not mix speeds."""
        if blend not in BLENDS:
            raise ValueError(f'blend: {blend!r} not in {list(BLENDS)}')
        newest = self.newest
        if newest is None:
            return None
        index = newest.step_at(now_s)
        if index < 0:
            return None
        if index >= newest.num_steps:
            if self._ran_out:
                return None
            self._ran_out = True
            skipped = newest.num_steps - 1 - self._decided
            self._decided = newest.num_steps - 1
            self._chunks = [newest]
            return RunOut(newest, skipped)
        if index <= self._decided:
            return None
        skipped, self._decided = index - self._decided - 1, index
        if blend == 'latest':
            return DueStep(newest, index, newest.actions[index], newest.step_age(index, now_s),
                           skipped)
        self._prune(now_s)
        older = self._older_steps(now_s, max_age_s, per_period_dims)
        actions = [newest.actions[index]] + [action for action, _ in older]
        ages = [newest.step_age(index, now_s)] + [age for _, age in older]
        return DueStep(newest, index, blend_steps(actions, decay), max(ages), skipped,
                       len(actions))

    def _older_steps(self, at_s: float, max_age_s: float, per_period_dims: int) -> list:
        """(action, age) of the step each older chunk has at `at_s`, newest first, for an
        ensemble: only chunks still covering `at_s` with that step at most `max_age_s` old,
        displacements rescaled to the newest chunk's period (`due`)."""
        newest, steps = self.newest, []
        for chunk in reversed(self._chunks[:-1]):
            i = chunk.step_at(at_s)
            if 0 <= i < chunk.num_steps and chunk.step_age(i, at_s) <= max_age_s:
                action = chunk.actions[i]
                if per_period_dims and chunk.period_s != newest.period_s:
                    action = action.copy()
                    action[:per_period_dims] *= newest.period_s / chunk.period_s
                steps.append((action, chunk.step_age(i, at_s)))
        return steps

    def planned(self, *, blend: str = 'latest', decay: float = 0.0,
                max_age_s: float = math.inf, per_period_dims: int = 0) -> list:
        """The newest chunk's K steps as `due` would give them at each slot's start with the
        chunks kept now: ``latest`` its own steps; ``ensemble`` each slot's blend with the
        older chunks still covering it. What an output that sends the chunk as one trajectory
        sends (a JointTrajectoryController's), so that the trajectory and the per-step
        outputs agree. Decides nothing."""
        if blend not in BLENDS:
            raise ValueError(f'blend: {blend!r} not in {list(BLENDS)}')
        newest = self.newest
        if newest is None:
            return []
        if blend == 'latest':
            return list(newest.actions)
        plan = []
        for index in range(newest.num_steps):
            older = self._older_steps(newest.slot_start(index), max_age_s, per_period_dims)
            plan.append(blend_steps([newest.actions[index]] + [a for a, _ in older], decay))
        return plan

    def is_running(self, now_s: float) -> bool:
        """Whether the newest chunk still has a slot at or after `now_s` (it has not run
        out)."""
        newest = self.newest
        return newest is not None and not self._ran_out and now_s < newest.end_s

    def next_wake_s(self) -> float | None:
        """When `due` has something new next: the next step's slot start, or the newest
        chunk's end (its run-out); None when there is nothing to wait for."""
        newest = self.newest
        if newest is None or self._ran_out:
            return None
        nxt = self._decided + 1
        return newest.slot_start(nxt) if nxt < newest.num_steps else newest.end_s


__all__ = ['BLENDS', 'INVALID_CHUNK_RULES', 'Chunk', 'StepAction', 'DueStep', 'RunOut',
           'ChunkDecision', 'ChunkSchedule', 'blend_steps', 'chunk_age_limit', 'decide_chunk',
           'ensemble_weights']
