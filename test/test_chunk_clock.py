"""The chunk clock's thread (ros/chunk_clock.py) on a node clock the test drives: no DDS, no
rclpy. A chunk's steps come from chunk_rules.ChunkSchedule, as a robot channel's do.

  - under sim time running 4x faster than the wall clock, every step of a chunk is published,
    none early and none skipped (before, a delay on the node clock was slept on the wall
    clock, up to 50 ms: 200 ms of simulated time, and every other step was skipped);
  - on a paused simulation, `stop` ends the thread at once;
  - on the wall clock, every step is published, none early.
"""
import threading
import time

import numpy as np
import pytest

from vla_spec_ros.ros import chunk_rules
from vla_spec_ros.ros.chunk_clock import ChunkClock

START_S = 100.0          # the node clock when the test starts (seconds)
TIMEOUT = 10.0           # wall seconds: generous, a loaded 2-core machine may be slow


class _Time:
    def __init__(self, nanoseconds: int):
        self.nanoseconds = nanoseconds


class RateClock:
    """A node clock at START_S that runs `rate` times as fast as the wall clock (0: paused).
    `ros_time_is_active` as an rclpy ROSClock has it: True under sim time."""

    def __init__(self, rate: float, *, is_sim_time: bool):
        self.rate, self.ros_time_is_active = rate, is_sim_time
        self._wall0 = time.monotonic()

    def now(self):
        return _Time(round((START_S + (time.monotonic() - self._wall0) * self.rate) * 1e9))


class FakeNode:
    def __init__(self, clock):
        self.clock, self.errors = clock, []

    def get_clock(self):
        return self.clock

    def get_logger(self):
        node = self

        class Logger:
            def error(self, text, **kwargs):
                node.errors.append(text)
        return Logger()


class StepChannel:
    """One robot's chunk (`num_steps` steps of `period_s` from `start_s`), published by the
    clock's `publish_due_step` as a robot channel does; what it published is recorded."""

    def __init__(self, start_s: float, num_steps: int, period_s: float):
        self.chunk = chunk_rules.Chunk(np.zeros((num_steps, 7)), start_s, period_s)
        self.schedule = chunk_rules.ChunkSchedule()
        self.schedule.add(self.chunk, start_s)
        self.lock = threading.Lock()
        self.published, self.lateness_s = [], []
        self.num_skipped, self.ran_out = 0, False

    def publish_due_step(self, now_s: float):
        with self.lock:
            due = self.schedule.due(now_s)
            if isinstance(due, chunk_rules.DueStep):
                self.published.append(due.index)
                self.lateness_s.append(now_s - self.chunk.slot_start(due.index))
            if isinstance(due, (chunk_rules.DueStep, chunk_rules.RunOut)):
                self.num_skipped += due.num_skipped
            self.ran_out = self.ran_out or isinstance(due, chunk_rules.RunOut)
            return self.schedule.next_wake_s()


def wait_until(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f'timed out after {timeout} s waiting for {what}'
        time.sleep(0.01)


def run_chunk(clock, num_steps: int, period_s: float) -> StepChannel:
    """A chunk starting now, played by a ChunkClock to its run-out."""
    node = FakeNode(clock)
    channel = StepChannel(clock.now().nanoseconds * 1e-9, num_steps, period_s)
    chunk_clock = ChunkClock(node, [channel])
    chunk_clock.start()
    try:
        wait_until(lambda: channel.ran_out, 'the chunk to run out')
    finally:
        chunk_clock.stop()
    assert not node.errors
    return channel


@pytest.mark.parametrize('is_sim_time, rate', [(True, 4.0), (False, 1.0)])
def test_every_step_is_published_on_time_on_sim_time_faster_than_the_wall_clock(
        is_sim_time, rate):
    """The reviewer's case (control_period 0.1 s, 20 steps, simulated time at 4x: 10 of 20
    steps were skipped), and the wall clock's case unchanged."""
    num_steps, period_s = 20, 0.1
    channel = run_chunk(RateClock(rate, is_sim_time=is_sim_time), num_steps, period_s)
    assert channel.num_skipped == 0, (channel.published, channel.lateness_s)
    assert channel.published == list(range(num_steps))
    assert min(channel.lateness_s) >= 0.0             # never early


def test_stop_ends_the_thread_at_once_on_a_paused_simulation():
    """A paused simulator's clock never reaches the next slot: the thread sleeps in short
    slices, and `stop` still ends it at once (not after a slot that never comes)."""
    clock = RateClock(0.0, is_sim_time=True)
    channel = StepChannel(START_S + 1.0, 4, 0.1)      # its first slot one simulated s away
    chunk_clock = ChunkClock(FakeNode(clock), [channel])
    chunk_clock.start()
    wall0 = time.monotonic()
    chunk_clock.stop(timeout=TIMEOUT)
    assert time.monotonic() - wall0 < 1.0
    assert not chunk_clock._thread.is_alive() and channel.published == []


class BrokenChannel:
    """A robot whose step publishing raises (an output's bug)."""

    label = 'broken'

    def publish_due_step(self, now_s: float):
        raise RuntimeError('an output failed')


def test_one_robots_failing_step_does_not_stop_the_other_robots_steps():
    """A robot listed first whose `publish_due_step` raises: logged, and the robot after it
    still publishes every step (before: one try around all robots, so every round ended at
    the failure and the others got nothing until the idle wait)."""
    clock = RateClock(1.0, is_sim_time=False)
    node = FakeNode(clock)
    channel = StepChannel(clock.now().nanoseconds * 1e-9, 5, 0.05)
    chunk_clock = ChunkClock(node, [BrokenChannel(), channel])
    chunk_clock.start()
    try:
        wait_until(lambda: channel.ran_out, 'the healthy robot\'s chunk to run out')
    finally:
        chunk_clock.stop()
    assert channel.published == list(range(5)) and channel.num_skipped == 0
    assert node.errors and 'broken' in node.errors[0]
