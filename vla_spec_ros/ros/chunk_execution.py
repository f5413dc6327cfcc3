"""One robot's chunked-model execution: a finished chunk checked and kept, its steps published
one per control period (the rules: chunk_rules.py, docs/chunks.md).

The channel (robot_channel.py) owns the outputs and the holds; this file owns the robot's
ChunkSchedule and the lock that orders a chunk's arrival and its steps' publishing (the worker
thread and the step clock both reach it). Its log lines go through the robot's own reason log
(RobotChannel.log_reason, hold_log.py).
"""
from __future__ import annotations

import threading

from vla_spec_ros.ros import chunk_rules as chunks
from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.channel_stats import record_answer
from vla_spec_ros.ros.message_time import offset_stamp


class ChunkExecution:
    """`channel`: the RobotChannel whose chunks these are; `on_chunk()` (optional) wakes the
    step clock when a chunk arrives."""

    def __init__(self, channel, on_chunk=None):
        self.channel = channel
        self.schedule = chunks.ChunkSchedule()
        self._lock = threading.RLock()            # schedule + the steps' publishing order
        self._on_chunk = on_chunk

    def clear(self) -> None:
        with self._lock:
            self.schedule.clear()

    def handle_finished(self, finished) -> None:
        """A chunked model's frame: check the whole chunk (chunk_rules.decide_chunk), keep
        it, hand it to the outputs whole and publish its step that is due now."""
        channel = self.channel
        info = finished.frame.user_data
        settings = channel.settings
        with self._lock:
            now = channel.now_s()
            decision = chunks.decide_chunk(
                finished.result, error=finished.error,
                is_enabled=settings.enabled and channel.is_active,
                age_s=cmd.observation_age(now, info.stamp_s, info.receipt_s, settings),
                num_steps=channel.chunk_steps, settings=settings,
                action_dim=channel.action_dim)
            if decision.hold_reason is not None:
                if self._goes_on_despite(decision.hold_reason, now):
                    channel.stats.record_chunk_refused(decision.hold_reason)
                    channel.log_reason(
                        f'chunk refused: {decision.hold_reason}; the chunk of the image at '
                        f'{self.schedule.newest.start_s:.3f} s goes on (invalid_chunk: '
                        'continue)', 'error')
                    return
                channel.reject_result(decision.hold_reason)
                return
            prepared = channel.prepare(info, settings)
            if prepared is None:
                return
            chunk = chunks.Chunk(decision.actions,
                                 cmd.observation_time(info.stamp_s, info.receipt_s, settings),
                                 settings.control_period, info.stamp)
            accepted, replaced = self.schedule.add(chunk, now)
            if not accepted:
                channel.log_reason('chunk ignored: its image is not newer than the chunk '
                                   'being executed (camera clock stepped back?)', 'warning')
                return
            if channel.is_active:
                for output, value in zip(channel.outputs, prepared):
                    output.publish_chunk(chunk, decision.commands, settings, value)
            self._publish_due(now, from_clock=False)
        channel.stats.record_chunk(replaced=replaced)
        record_answer(channel.stats, info, finished.result.stats, channel.age_of(info))
        if self._on_chunk is not None:
            self._on_chunk()

    def _goes_on_despite(self, reason: str, now_s: float) -> bool:
        """`invalid_chunk: continue`: a chunk refused because it did not decode leaves a kept
        chunk that still has steps running (each step is still checked for its age when due).
        Every other reason (disabled, engine error, non-finite, stale) drops the kept chunks
        and holds."""
        return (self.channel.settings.invalid_chunk == 'continue'
                and cmd.reason_kind(reason) == cmd.REASON_INVALID
                and self.schedule.is_running(now_s))

    def publish_due(self, now_s: float) -> float | None:
        """The step due at `now_s` (node clock), if any and not yet decided; returns when the
        next one is due (node clock seconds) or None. (Step clock thread.)"""
        with self._lock:
            return self._publish_due(now_s, from_clock=True)

    def _publish_due(self, now_s: float, *, from_clock: bool) -> float | None:
        channel = self.channel
        settings = channel.settings
        if not (settings.enabled and channel.is_active):
            self.schedule.clear()
            return None
        due = self.schedule.due(now_s, blend=settings.chunk_blend,
                                decay=settings.chunk_ensemble_decay,
                                max_age_s=settings.max_action_age)
        if isinstance(due, chunks.RunOut):
            channel.stats.record_chunk_run_out(due.num_skipped)
            channel.reject(f'{cmd.REASON_CHUNK_END}: the {due.chunk.num_steps} steps of the '
                           f'image at {due.chunk.start_s:.3f} s are done and no newer chunk '
                           'arrived')
        elif due is not None:
            command = cmd.decide_command(chunks.StepAction(due.action), error=None,
                                         is_enabled=True, age_s=due.age_s, settings=settings,
                                         action_dim=channel.action_dim)
            if command.is_hold:
                channel.stats.record_chunk_step(published=False, num_skipped=due.num_skipped)
                channel.reject(command.hold_reason, keep_chunk=True)
            else:
                stamp = offset_stamp(due.chunk.stamp, due.index * due.chunk.period_s)
                if channel.release():
                    for output in channel.outputs:
                        output.publish_step(due.chunk, due.index, command, stamp, settings)
                late = channel.now_s() - due.chunk.slot_start(due.index) if from_clock else None
                channel.stats.record_chunk_step(published=True, num_skipped=due.num_skipped,
                                                lateness_s=late)
        return self.schedule.next_wake_s()


__all__ = ['ChunkExecution']
