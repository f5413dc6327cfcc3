"""One robot's chunk execution (ros/chunk_execution.py) through its narrow interface alone.

`ChunkExecution` sees its robot only as a `ChunkChannel` (values and callables), so these tests
run it without rclpy and without a channel: a fake robot records what would be published and
held, on a fake node clock. The DDS tests of the whole node are test_ros_chunks.py.
"""
import dataclasses

import numpy as np
import pytest

from vla_spec_ros.engine.result import ActionResult, FinishedAction, Frame
from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros import params
from vla_spec_ros.ros.chunk_execution import ChunkChannel, ChunkExecution
from vla_spec_ros.ros.diagnostics import InferenceStats
from vla_spec_ros.ros.frame_slot import FrameInfo

K, P = 4, 0.2          # steps per chunk, control period (s)


@dataclasses.dataclass(frozen=True)
class Stamp:
    """builtin_interfaces/Time's fields (message_time.offset_stamp builds another)."""

    sec: int
    nanosec: int


class FakeRobot:
    """A robot as ChunkExecution sees it: settings, a clock, and records of every call."""

    def __init__(self, **settings):
        self.settings = dataclasses.replace(params.default_node_settings(), enabled=True,
                                            instruction='go', max_action_age=0.5, **settings)
        self.now, self.is_active, self.can_prepare, self.servo_ready = 100.0, True, True, True
        self.stats = InferenceStats()
        self.chunks, self.steps, self.holds, self.logs = [], [], [], []

    def channel(self) -> ChunkChannel:
        return ChunkChannel(
            num_steps=K, action_dim=7, stats=self.stats, settings=lambda: self.settings,
            is_active=lambda: self.is_active, now_s=lambda: self.now, prepare=self._prepare,
            publish_chunk=lambda chunk, commands, settings, prepared:
                self.chunks.append((chunk, commands, prepared)),
            publish_step=self._publish_step,
            reject=self._reject, log_reason=lambda text, level: self.logs.append((level, text)))

    def _publish_step(self, chunk, index, command, stamp, settings):
        if self.servo_ready:
            self.steps.append((index, command, stamp))
        else:                    # RobotChannel.release: the robot holds instead
            self._reject('servo not ready: waiting', keep_chunk=True)
        return self.servo_ready

    def _prepare(self, info, settings):
        if not self.can_prepare:
            self._reject('no tool pose: none yet')
            return None
        return ['prepared']

    def _reject(self, reason, *, is_stale=False, keep_chunk=False):
        self.holds.append((reason, is_stale, keep_chunk))


def finished(t0: float, action=None, *, is_valid=True, error=None, receipt=None,
             instruction='go'):
    """The engine's answer to an image stamped t0 (node clock seconds), received at `receipt`
    (default t0), submitted under `instruction`."""
    receipt = t0 if receipt is None else receipt
    info = FrameInfo(Stamp(int(t0), round((t0 % 1) * 1e9)), t0, receipt, 0.0)
    if action is None:
        action = np.tile(np.arange(K, dtype=np.float64)[:, None] * 0.01, (1, 7))
    result = None if error else ActionResult((), action, action, is_valid,
                                             None if is_valid else 'token 3 is not an action')
    return FinishedAction(0, Frame(np.zeros((2, 2, 3), np.uint8), instruction,
                                   user_data=info), result, error)


def test_a_chunk_is_kept_whole_then_published_one_step_per_period_then_runs_out():
    robot = FakeRobot()
    woken = []
    execution = ChunkExecution(robot.channel(), on_chunk=lambda: woken.append(True))
    robot.now = 100.05
    execution.handle_finished(finished(100.0))
    assert len(robot.chunks) == 1 and len(robot.chunks[0][1]) == K     # whole, K commands
    assert robot.chunks[0][2] == ['prepared'] and woken == [True]
    assert [s[0] for s in robot.steps] == [0]                          # step 0 is due now
    assert robot.steps[0][2] == Stamp(100, 0)
    for index in range(1, K):
        wake = execution.publish_due(robot.now)
        assert wake == pytest.approx(100.0 + index * P)
        robot.now = wake + 1e-6
        assert execution.publish_due(robot.now) is not None
        assert robot.steps[-1][0] == index
        # The step's stamp: the image's + index periods, in whole nanoseconds.
        assert robot.steps[-1][2] == Stamp(100, round(index * P * 1e9))
    robot.now = 100.0 + K * P
    execution.publish_due(robot.now)
    assert robot.holds[-1][0].startswith(cmd.REASON_CHUNK_END)
    snapshot = robot.stats.snapshot(0.0)
    assert snapshot['chunk_steps_published'] == K and snapshot['chunk_run_outs'] == 1


def test_no_step_of_a_chunk_goes_out_once_the_instruction_is_another():
    """The instruction changes while a chunk runs: the channel's own hold waits for the
    worker's turn to end (up to a step, over a second on a loaded machine), and meanwhile the
    chunk clock published the old instruction's steps (6 in 40 changes through the node at
    control_period 0.2 s). Now the first due step after the change holds with the new
    instruction's reason and drops the chunks, and a result decided under the old one that
    arrives after the change (the channel checked it just before) is not kept either."""
    robot = FakeRobot()
    execution = ChunkExecution(robot.channel())
    robot.now = 100.01
    execution.handle_finished(finished(100.0))
    assert [s[0] for s in robot.steps] == [0]
    robot.settings = dataclasses.replace(robot.settings, instruction='stop')
    robot.now = 100.0 + P + 1e-6                              # step 1 is due
    assert execution.publish_due(robot.now) is None
    assert [s[0] for s in robot.steps] == [0]
    assert robot.holds[-1][0] == cmd.instruction_change_reason('stop')
    assert 'stop' in robot.holds[-1][0] and execution.schedule.newest is None
    # A result of the old instruction finishing now: held, not kept, not published.
    held = len(robot.holds)
    execution.handle_finished(finished(100.2, instruction='go'))
    assert len(robot.holds) == held + 1 and execution.schedule.newest is None
    assert [s[0] for s in robot.steps] == [0] and len(robot.chunks) == 1
    # The new instruction's chunk is kept and runs.
    execution.handle_finished(finished(100.2, instruction='stop'))
    assert len(robot.chunks) == 2 and robot.steps[-1][0] == 0
    robot.now = 100.2 + P + 1e-6
    execution.publish_due(robot.now)
    assert robot.steps[-1][0] == 1


def test_a_camera_clock_ahead_of_the_node_does_not_push_the_steps_into_the_future():
    """Images stamped 0.3 s ahead of their arrival (accepted: max_action_age is 0.5 s) are
    timed and stamped from their arrival (command_rules.aged_from, command_stamp): step 0 goes
    out at once and the next steps one period apart. Timed from the stamp, each new chunk
    replaced the one before it before its first slot came, and nothing moved the robot at
    all; stamped from it, MoveIt Servo would let each step stand 0.3 s past its timeout."""
    robot, ahead = FakeRobot(), 0.3
    execution = ChunkExecution(robot.channel())
    for arrival in (100.0, 100.1, 100.2):        # the camera sends faster than the chunk plays
        robot.now = arrival + 0.01
        execution.handle_finished(finished(arrival + ahead, receipt=arrival))
        assert robot.steps and robot.steps[-1][0] == 0, robot.steps
        assert robot.steps[-1][2] == Stamp(100, round((arrival - 100) * 1e9))   # the arrival
    assert len(robot.steps) == 3 and not robot.holds
    wake = execution.publish_due(robot.now)
    assert wake == pytest.approx(100.2 + P)                 # the arrival + one period
    robot.now = wake + 1e-6
    execution.publish_due(robot.now)
    assert robot.steps[-1][0] == 1 and not robot.holds


def test_a_control_period_changed_mid_chunk_does_not_rescale_its_steps():
    """Each step is a displacement over its chunk's period: after `control_period` drops from
    0.2 to 0.02 s, the chunk's next step still goes out at the velocity computed when it
    arrived (before, delta / 0.02: ten times the planned speed, bounded only by the limits),
    on the chunk's own slot grid; a later chunk takes the new period."""
    robot = FakeRobot(max_linear_speed=10.0)
    execution = ChunkExecution(robot.channel())
    robot.now = 100.05
    execution.handle_finished(finished(100.0))
    planned = robot.chunks[0][1]                       # the K commands decided on arrival
    robot.settings = dataclasses.replace(robot.settings, control_period=0.02)
    robot.now = 100.0 + P + 1e-6                       # step 1's slot on the chunk's grid
    execution.publish_due(robot.now)
    index, command, _ = robot.steps[-1]
    assert index == 1 and command.linear == pytest.approx(planned[1].linear)
    assert command.linear[0] == pytest.approx(0.01 / P)
    robot.now = 100.5
    execution.handle_finished(finished(100.45))      # a new chunk: the new period
    assert robot.chunks[-1][0].period_s == 0.02
    index, command, _ = robot.steps[-1]               # its slot 2 holds now (0.05 s later)
    assert index == 2 and command.linear[0] == pytest.approx(0.02 / 0.02)


def _first_step_held_while_servo_not_ready():
    """A chunk arrived at 100.05 s for an image at 100 s while Servo was not ready: its first
    step held instead of going out, the chunk kept."""
    robot = FakeRobot()
    robot.servo_ready = False
    execution = ChunkExecution(robot.channel())
    robot.stats.set_hold_reason('servo not ready: waiting')
    robot.now = 100.05
    execution.handle_finished(finished(100.0))
    return robot, execution


def test_a_chunk_whose_first_step_the_robot_held_is_not_counted_as_an_action():
    """While MoveIt Servo is not ready the channel holds instead of publishing a step: the
    chunk is kept (its later steps may go out), but it is not an action published, and the
    hold's reason stands in /diagnostics (record_answer clears it)."""
    robot, execution = _first_step_held_while_servo_not_ready()
    snapshot = robot.stats.snapshot(0.0)
    assert len(robot.chunks) == 1 and robot.steps == []
    assert snapshot['actions_published'] == 0
    assert snapshot['hold_reason'].startswith('servo not ready')
    robot.servo_ready = True
    robot.now = 100.05 + 0.01
    execution.handle_finished(finished(100.06))        # a newer chunk, Servo ready
    assert robot.stats.snapshot(0.0)['actions_published'] == 1 and robot.steps[-1][0] == 0


def test_a_later_step_published_after_a_held_one_ends_the_hold_in_diagnostics():
    """Step 0 held (Servo not ready) with the chunk kept; step 1 goes out: the robot moves
    again, so /diagnostics no longer names the hold (before: the reason stood until the next
    chunk's first step, while the robot was moving)."""
    robot, execution = _first_step_held_while_servo_not_ready()
    assert robot.steps == [] and robot.stats.snapshot(0.0)['hold_reason']
    robot.servo_ready = True
    robot.now = execution.publish_due(robot.now) + 1e-6
    execution.publish_due(robot.now)
    assert robot.steps[-1][0] == 1
    assert robot.stats.snapshot(0.0)['hold_reason'] == ''


def test_invalid_chunk_continue_keeps_the_running_chunk_and_hold_drops_it():
    for rule, expect_hold in (('continue', False), ('hold', True)):
        robot = FakeRobot(invalid_chunk=rule)
        execution = ChunkExecution(robot.channel())
        execution.handle_finished(finished(100.0))
        robot.now = 100.1
        execution.handle_finished(finished(100.05, is_valid=False))
        if expect_hold:
            assert robot.holds and robot.holds[-1][0].startswith(cmd.REASON_INVALID)
            assert robot.holds[-1][1:] == (False, False)      # not stale, chunks dropped
        else:
            assert robot.holds == []
            assert robot.logs[-1][0] == 'error' and 'goes on' in robot.logs[-1][1]
            assert robot.stats.snapshot(0.0)['chunks_refused'] == 1
            robot.now = 100.2 + 1e-6
            execution.publish_due(robot.now)
            assert robot.steps[-1][0] == 1                    # the kept chunk's next step


def test_a_stale_chunk_is_a_stale_hold_and_nothing_is_kept():
    robot = FakeRobot()
    execution = ChunkExecution(robot.channel())
    robot.now = 100.0 + 0.5 + (K - 1) * P + 0.1           # past the chunk's age limit
    execution.handle_finished(finished(100.0))
    assert robot.chunks == [] and robot.steps == []
    assert robot.holds[-1][0].startswith(cmd.REASON_STALE) and robot.holds[-1][1] is True
    assert len(execution.schedule) == 0


def test_an_output_that_cannot_prepare_keeps_nothing():
    robot = FakeRobot()
    robot.can_prepare = False
    execution = ChunkExecution(robot.channel())
    execution.handle_finished(finished(100.0))
    assert robot.chunks == [] and len(execution.schedule) == 0
    assert robot.holds == [('no tool pose: none yet', False, False)]


def test_a_disabled_or_inactive_robot_publishes_no_step_and_forgets_its_chunks():
    robot = FakeRobot()
    execution = ChunkExecution(robot.channel())
    execution.handle_finished(finished(100.0))
    robot.is_active = False
    robot.now = 100.2 + 1e-6
    assert execution.publish_due(robot.now) is None
    assert [s[0] for s in robot.steps] == [0] and len(execution.schedule) == 0
    robot.is_active = True
    robot.settings = dataclasses.replace(robot.settings, enabled=False)
    execution.handle_finished(finished(100.3))
    assert robot.holds[-1][0] == cmd.REASON_DISABLED


def test_an_engine_error_holds_with_its_reason():
    robot = FakeRobot()
    execution = ChunkExecution(robot.channel())
    execution.handle_finished(finished(100.0, error='RuntimeError: boom'))
    assert robot.holds[-1][0] == f'{cmd.REASON_ENGINE_ERROR}: RuntimeError: boom'


def test_point_due_is_the_point_a_trajectory_approaches_and_none_outside_it():
    """message_time.point_due (the stops of joint_outputs.py and pose_output.py): point k is
    due (k + 1) periods after the stamp, so during [k P, (k + 1) P) the robot approaches
    point k; none before the stamp (a former time line) nor after the last point."""
    from vla_spec_ros.ros.message_time import point_due

    assert point_due(100.0, 0.2, 4, 99.99) is None
    assert [point_due(100.0, 0.2, 4, 100.0 + t) for t in (0.0, 0.19, 0.21, 0.79)] == \
        [0, 0, 1, 3]
    assert point_due(100.0, 0.2, 4, 100.81) is None


def test_with_ensemble_the_whole_chunk_an_output_gets_is_the_blend_its_steps_will_be():
    """chunk_blend ensemble: a trajectory output (a JointTrajectoryController's) gets, on the
    chunk's arrival, each step blended with the older chunk covering it, computed here by
    hand: the mean of the two chunks' steps at that slot's start (before: the newest chunk's
    raw steps, while the per-step topics carried the blend)."""
    robot = FakeRobot(chunk_blend='ensemble', chunk_ensemble_decay=0.0)
    execution = ChunkExecution(robot.channel())
    older = np.tile(np.linspace(0.0, 0.03, K)[:, None], (1, 7))
    newer = np.tile(np.linspace(0.05, 0.08, K)[:, None], (1, 7))
    robot.now = 100.0
    execution.handle_finished(finished(100.0, older))
    robot.now = 100.3
    execution.handle_finished(finished(100.3, newer))
    (_, commands, _) = robot.chunks[-1]
    for i, command in enumerate(commands):
        at = 100.3 + i * P
        j = int(np.floor((at - 100.0) / P + 1e-9))
        steps = [newer[i]]
        if j < K and at - (100.0 + j * P) <= robot.settings.max_action_age:
            steps.append(older[j])
        expected = cmd.command_from_action(np.mean(steps, axis=0), robot.settings)
        np.testing.assert_allclose(command.linear, expected.linear, rtol=0, atol=1e-12)
    assert commands[0].linear != cmd.command_from_action(newer[0], robot.settings).linear


def test_settings_are_swapped_between_steps_never_in_the_middle_of_one():
    """RobotChannel.replace_settings swaps a robot's settings inside `between_steps`: a step
    being decided and published under the old settings goes out first, and every later step
    sees the new ones. Before, a step that had passed the instruction check before the swap
    still went out after it (1 in 38 changes through the node)."""
    import threading

    inside, release = threading.Event(), threading.Event()

    class SlowRobot(FakeRobot):
        def _publish_step(self, *args):
            if self.steps:                  # step 1 waits in the middle of its publishing
                inside.set()
                release.wait(5.0)
            return super()._publish_step(*args)

    robot = SlowRobot()
    execution = ChunkExecution(robot.channel())
    robot.now = 100.01
    execution.handle_finished(finished(100.0))
    robot.now = 100.0 + P + 1e-6
    clock = threading.Thread(target=execution.publish_due, args=(robot.now,))
    clock.start()
    assert inside.wait(5.0)
    lock = execution.between_steps()
    assert not lock.acquire(timeout=0.05)        # the step in progress holds the swap back
    release.set()
    assert lock.acquire(timeout=5.0)              # then the swap goes in
    lock.release()
    clock.join(5.0)
    assert [s[0] for s in robot.steps] == [0, 1]
