"""Each robot's recording of the frames the engine acts on (`record_dir`): the bag a robot's
frames go to, and what happens when recording fails. Recording never stops control: a write
or a close that fails (a full disk, a removed folder) stops that robot's recording with the
reason in the log, and never reaches the worker, which would take it for an engine failure
and hold every robot. The node clock going back (a simulator reset) starts a new bag (a bag
is in time order; frames stamped before its last would not be recorded)."""
from __future__ import annotations

import contextlib
import os
import time

from vla_spec_ros.engine.result import Frame, describe_error


def robot_record_dir(settings, robot: str) -> str:
    """The folder of `robot`'s bags, created (with its parents) when missing; ValueError
    naming record_dir when it cannot be (not a folder, no permission, a read-only file
    system)."""
    parent = os.path.join(settings.record_dir, robot)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise ValueError(f'record_dir: cannot create {parent!r} for recordings: '
                         f'{exc.strerror or exc}') from None
    return parent


def prepare_record_dirs(robots: dict) -> None:
    """Every robot's bag folder (`robots`: {name: NodeSettings}), before the model loads: a
    record_dir that cannot hold recordings fails the start at once, naming the parameter,
    not after a 7B model has loaded."""
    for robot, settings in robots.items():
        if settings.record_dir:
            robot_record_dir(settings, robot)


def make_recorder(settings, robot: str):
    """The frame recorder of `record_dir`, or None when recording is off. Each start writes a
    new bag, `<record_dir>/[<robot>/]vla_spec_<UTC time>`, so a restart never overwrites one.
    Its files are split every `record_split_s` (the diagnostics timer closes a due split), so
    a killed node leaves a bag readable up to its last closed split; a clean shutdown or a
    lifecycle cleanup closes the last one."""
    if not settings.record_dir:
        return None
    from vla_spec_ros.recording import FrameRecorder

    parent = robot_record_dir(settings, robot)
    name = time.strftime('vla_spec_%Y%m%d_%H%M%S', time.gmtime())
    directory, run = os.path.join(parent, name), 1
    while os.path.exists(directory):             # two starts within one second
        run += 1
        directory = os.path.join(parent, f'{name}_{run}')
    return FrameRecorder(directory, min_period_s=settings.record_period,
                         max_bytes=settings.record_max_mb * 1024 * 1024,
                         split_s=settings.record_split_s or None)


class RobotRecordings:
    """The recorders of `robots` ({name: NodeSettings}; None where recording is off), made
    at once (an error propagates, nothing left open). `node`: its clock stamps the frames,
    its logger says what happened."""

    def __init__(self, node, robots: dict):
        self.node = node
        self.recorders: dict = {}
        try:
            for robot, settings in robots.items():
                self.recorders[robot] = make_recorder(settings, robot)
        except Exception:
            self.close()
            raise
        for robot, recorder in self.recorders.items():
            if recorder is not None:
                node.get_logger().info(f'recording {self._label(robot)} to {recorder.path}')

    def _label(self, robot: str) -> str:
        return robot or self.node.get_name()

    def record(self, robot: str, settings, frame: Frame) -> None:
        """Record a submitted frame of `robot` (the worker's thread)."""
        recorder = self.recorders.get(robot)
        if recorder is None or recorder.is_full or recorder.closed:
            return
        stamp_ns = self.node.get_clock().now().nanoseconds
        try:
            if recorder.last_stamp_ns is not None and stamp_ns < recorder.last_stamp_ns:
                recorder = self._next_bag(robot, settings, recorder)
            recorder.record(frame.images[0], frame.instruction, stamp_ns)
        except Exception as exc:
            self._stop(robot, recorder, exc)
            return
        if recorder.is_full:
            self.node.get_logger().warning(
                f'recording of {self._label(robot)} stopped: record_max_mb '
                f'({settings.record_max_mb} MB) reached; control goes on')

    def _next_bag(self, robot: str, settings, recorder):
        """The node clock went back: the frames from now on go to a new bag (before, none was
        recorded until the clock passed its old time again: every episode after the first of
        a simulator was lost)."""
        recorder.close()
        self.recorders[robot] = make_recorder(settings, robot)
        self.node.get_logger().info(
            f'recording of {self._label(robot)}: the node clock went back; frames from now on '
            f'go to {self.recorders[robot].path}')
        return self.recorders[robot]

    def close_due_splits(self) -> None:
        """Close the splits due (the diagnostics timer): a robot whose camera stopped has its
        last frames on disk."""
        for robot, recorder in list(self.recorders.items()):
            if recorder is not None and not recorder.closed:
                try:
                    recorder.close_split_if_due()
                except Exception as exc:       # a full disk must not take the node down
                    self._stop(robot, recorder, exc)

    def _stop(self, robot: str, recorder, exc: BaseException) -> None:
        self.node.get_logger().error(
            f'recording of {self._label(robot)} stopped: {describe_error(exc)}; control goes on')
        with contextlib.suppress(Exception):
            recorder.close()

    def close(self) -> None:
        """Close every recording; one that cannot be closed (a full disk) is logged, and the
        others and the rest of the shutdown go on."""
        for robot, recorder in list(self.recorders.items()):
            if recorder is None:
                continue
            try:
                recorder.close()
            except Exception as exc:
                self.node.get_logger().error(
                    f'recording of {self._label(robot)} could not be closed: '
                    f'{describe_error(exc)}')


__all__ = ['RobotRecordings', 'make_recorder']
