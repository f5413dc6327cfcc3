"""One robot's chunked-model execution: a finished chunk checked and kept, its steps published
one per control period (the rules: chunk_rules.py, docs/chunks.md).

The robot's channel (robot_channel.py) owns the outputs and the holds; this file owns the
robot's ChunkSchedule and the lock that orders a chunk's arrival and its steps' publishing (the
worker thread and the chunk clock both reach it). It sees the channel only through
`ChunkChannel`, the few values and callables it needs, so it runs without rclpy (as its tests
do, on a fake clock).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from vla_spec_ros.ros import chunk_rules as chunks
from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.channel_stats import record_answer
from vla_spec_ros.ros.diagnostics import InferenceStats
from vla_spec_ros.ros.message_time import offset_stamp


@dataclass(frozen=True)
class ChunkChannel:
    """What a robot's chunk execution needs from its channel, and nothing more.

    Values:
      num_steps     K, the model's action_chunk (steps per chunk)
      action_dim    values per step (command_rules.check_action_dim)
      stats         the robot's counters (chunks, steps, answered frames)
    Reads:
      settings()    the robot's NodeSettings in force
      is_active()   whether the node acts (a lifecycle node: active)
      now_s()       the node clock, in seconds
    Acts (called under the execution's lock):
      prepare(info, settings) -> list | None
                    each output's `prepare` for the observation `info` (frame_slot.FrameInfo),
                    or None after the channel held because one cannot be computed
      publish_chunk(chunk, commands, settings, prepared)
                    a kept chunk (chunk_rules.Chunk, its K decided commands) to every output,
                    whole; nothing while inactive
      publish_step(chunk, index, command, stamp, settings) -> bool
                    step `index`, due now, to every output; whether it went out (the channel
                    holds instead while it may not command: inactive, MoveIt Servo not ready)
      reject(reason, *, is_stale=False, keep_chunk=False)
                    count a hold and send it; the chunks are dropped (clear) unless keep_chunk
      log_reason(text, level)
                    the robot's throttled log line (hold_log.py), level 'error', 'warning' or
                    'info'
    """

    num_steps: int
    action_dim: int
    stats: InferenceStats
    settings: Callable[[], Any]
    is_active: Callable[[], bool]
    now_s: Callable[[], float]
    prepare: Callable[..., list | None]
    publish_chunk: Callable[..., None]
    publish_step: Callable[..., bool]
    reject: Callable[..., None]
    log_reason: Callable[[str, str], None]


class ChunkExecution:
    """`robot`: the ChunkChannel of the robot whose chunks these are; `on_chunk()` (optional)
    wakes the chunk clock when a chunk arrives."""

    def __init__(self, robot: ChunkChannel, on_chunk=None):
        self.robot = robot
        self.schedule = chunks.ChunkSchedule()
        # The instruction the kept chunks were decided under (every chunk kept was): once the
        # robot's instruction is another, none of their steps goes out. The channel's own
        # hold on a new instruction waits for the worker's turn to end (up to a step); the
        # chunk clock must not publish old steps meanwhile.
        self._instruction: str | None = None
        self._lock = threading.RLock()            # schedule + the steps' publishing order
        self._on_chunk = on_chunk

    def between_steps(self):
        """A context in which no step is being decided or published: new settings swapped in
        it (RobotChannel.replace_settings) reach every step decided after it, and a step
        decided before it has gone out (a new instruction's check, `_publish_due`, cannot
        race a step already past it)."""
        return self._lock

    def clear(self) -> bool:
        """Forget the chunks; whether one still had steps to run (was moving the robot)."""
        with self._lock:
            was_running = self.schedule.is_running(self.robot.now_s())
            self.schedule.clear()
        return was_running

    def handle_finished(self, finished) -> None:
        """A chunked model's frame: check the whole chunk (chunk_rules.decide_chunk), keep
        it, hand it to the outputs whole and publish its step that is due now."""
        robot, info = self.robot, finished.frame.user_data
        with self._lock:
            kept = self._keep(finished, robot.settings(), robot.now_s())
        if kept is None:
            return
        replaced, went_out = kept
        settings = robot.settings()
        robot.stats.record_chunk(replaced=replaced)
        if went_out:     # an answer acted on (not a chunk whose first step the robot held)
            record_answer(robot.stats, info, finished.result.stats,
                          cmd.observation_age(robot.now_s(), info.stamp_s, info.receipt_s,
                                              settings))
        if self._on_chunk is not None:
            self._on_chunk()

    def _keep(self, finished, settings, now: float) -> tuple[bool, bool] | None:
        """(Under the lock.) (Whether the kept chunk replaced another, whether its step due
        now went out), or None when it was not kept (refused, held, or its image not
        newer)."""
        robot, info = self.robot, finished.frame.user_data
        if finished.frame.instruction != settings.instruction:
            # Decided under an instruction no longer in force (it changed after the channel
            # checked the result): nothing of it goes out, the robot holds.
            robot.reject(cmd.instruction_change_reason(settings.instruction))
            return None
        decision = chunks.decide_chunk(
            finished.result, error=finished.error,
            is_enabled=settings.enabled and robot.is_active(),
            age_s=cmd.observation_age(now, info.stamp_s, info.receipt_s, settings),
            num_steps=robot.num_steps, settings=settings, action_dim=robot.action_dim)
        if decision.hold_reason is not None:
            self._refuse(decision.hold_reason, settings, now)
            return None
        prepared = robot.prepare(info, settings)
        if prepared is None:
            return None
        # Timed and stamped from the time the image is aged from: a camera clock ahead of the
        # node's (within max_action_age) neither pushes the steps' slots into the future nor
        # stamps them ahead (command_rules.command_stamp).
        chunk = chunks.Chunk(decision.actions,
                             cmd.aged_from(info.stamp_s, info.receipt_s, settings),
                             settings.control_period, cmd.command_stamp(info, settings))
        accepted, replaced = self.schedule.add(chunk, now)
        if not accepted:
            robot.log_reason('chunk ignored: its image is older than the chunk being '
                             'executed (camera clock stepped back?)', 'warning')
            return None
        self._instruction = settings.instruction
        robot.publish_chunk(chunk, self._chunk_commands(decision.commands, settings),
                            settings, prepared)
        _, went_out = self._publish_due(now, from_clock=False)
        return replaced, went_out

    def _chunk_commands(self, commands, settings) -> list:
        """(Under the lock, the new chunk kept.) The commands of the whole chunk for the
        outputs that send it as one trajectory: its own with ``latest``; with ``ensemble``
        each step blended with the older chunks as its step will be when due (before, a
        trajectory carried the newest chunk's raw steps while the per-step topics carried
        the blend)."""
        if settings.chunk_blend != 'ensemble':
            return commands
        plan = self.schedule.planned(blend='ensemble', decay=settings.chunk_ensemble_decay,
                                     max_age_s=settings.max_action_age,
                                     per_period_dims=cmd.displacement_dims(settings))
        return [cmd.command_from_action(action, settings) for action in plan]

    def _refuse(self, reason: str, settings, now_s: float) -> None:
        """A chunk that may not be kept. `invalid_chunk: continue`: one refused because it did
        not decode leaves a kept chunk that still has steps running (each step is still
        checked for its age when due). Every other reason (disabled, engine error,
        non-finite, stale) drops the kept chunks and holds."""
        robot = self.robot
        if (settings.invalid_chunk == 'continue'
                and cmd.reason_kind(reason) == cmd.REASON_INVALID
                and self.schedule.is_running(now_s)):
            robot.stats.record_chunk_refused(reason)
            robot.log_reason(f'chunk refused: {reason}; the chunk of the image at '
                             f'{self.schedule.newest.start_s:.3f} s goes on (invalid_chunk: '
                             'continue)', 'error')
            return
        robot.reject(reason, is_stale=cmd.is_stale_reason(reason))

    def publish_due(self, now_s: float) -> float | None:
        """The step due at `now_s` (node clock), if any and not yet decided; returns when the
        next one is due (node clock seconds) or None. (Chunk clock thread.)"""
        with self._lock:
            return self._publish_due(now_s, from_clock=True)[0]

    def _publish_due(self, now_s: float, *, from_clock: bool) -> tuple[float | None, bool]:
        """(When the next step is due, whether a step went out now.)"""
        robot = self.robot
        settings = robot.settings()
        if not (settings.enabled and robot.is_active()):
            self.schedule.clear()
            return None, False
        if self.schedule.newest is not None and self._instruction != settings.instruction:
            robot.reject(cmd.instruction_change_reason(settings.instruction))
            self.schedule.clear()
            return None, False
        due = self.schedule.due(now_s, blend=settings.chunk_blend,
                                decay=settings.chunk_ensemble_decay,
                                max_age_s=settings.max_action_age,
                                per_period_dims=cmd.displacement_dims(settings))
        went_out = False
        if isinstance(due, chunks.RunOut):
            robot.stats.record_chunk_run_out(due.num_skipped)
            robot.reject(f'{cmd.REASON_CHUNK_END}: the {due.chunk.num_steps} steps of the '
                         f'image at {due.chunk.start_s:.3f} s are done and no newer chunk '
                         'arrived')
        elif due is not None:
            went_out = self._publish_step(due, settings, from_clock)
        return self.schedule.next_wake_s(), went_out

    def _publish_step(self, due, settings, from_clock: bool) -> bool:
        """A due step through its own safety decision (its age), then to the outputs; a
        step that may not go out holds the robot and keeps the chunk (the next may be fine).
        Whether it went out."""
        robot = self.robot
        # A step is a displacement over its chunk's period: its velocity is computed with
        # that period, not a control_period changed since the chunk arrived (the step grid
        # keeps the old one too: chunk_rules.py); limits and scales in force apply.
        if settings.control_period != due.chunk.period_s:
            settings = replace(settings, control_period=due.chunk.period_s)
        command = cmd.decide_command(chunks.StepAction(due.action), error=None, is_enabled=True,
                                     age_s=due.age_s, settings=settings,
                                     action_dim=robot.action_dim)
        if command.is_hold:
            robot.stats.record_chunk_step(published=False, num_skipped=due.num_skipped)
            robot.reject(command.hold_reason, keep_chunk=True)
            return False
        stamp = offset_stamp(due.chunk.stamp, due.index * due.chunk.period_s)
        went_out = bool(robot.publish_step(due.chunk, due.index, command, stamp, settings))
        late = robot.now_s() - due.chunk.slot_start(due.index) if from_clock else None
        # Published only when it went out (an output may hold instead: Servo not ready).
        robot.stats.record_chunk_step(published=went_out, num_skipped=due.num_skipped,
                                      lateness_s=late)
        return went_out


__all__ = ['ChunkChannel', 'ChunkExecution']
