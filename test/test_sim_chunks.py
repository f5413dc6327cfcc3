"""Action chunks in the delayed lock-step: which step of which chunk the arm executes at each
control period (pure Python), and a short in-process episode with a random chunked model."""
import dataclasses
import os

import numpy as np
import pytest

from vla_spec_ros.sim.answer_pairing import AnswerPairs, FrameRegistry
from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep, chunk_step_due
from vla_spec_ros.sim.lockstep_matching import LockstepMatcher
from vla_spec_ros.sim.realtime_clock import RealtimeCommand

K = 4


def plan(frame_period: int, steps: int = K) -> np.ndarray:
    """A chunk whose step i moves x by 100 * frame_period + i (so an action tells its origin)."""
    out = np.zeros((steps, 7))
    out[:, 0] = 100 * frame_period + np.arange(steps)
    out[:, 6] = 0.5
    return out


def run(delay: DelayedLockstep, periods: int, steps: int = K) -> list:
    """(source, x, is_fresh) per period, the policy answering every wanted frame."""
    out = []
    for t in range(periods):
        if delay.wants_frame(t):
            delay.answer(t, plan(t, steps))
        action, is_fresh = delay.action_at(t)
        out.append((delay.source, action[0], is_fresh))
    return out


def test_chunk_step_due_covers_the_chunk_periods_only():
    assert [chunk_step_due(5, K, p) for p in range(3, 11)] == [
        None, None, 0, 1, 2, 3, None, None]


@pytest.mark.parametrize('frames', ['every', 'one_in_flight'])
def test_delay_zero_applies_step_zero_of_each_chunk_or_the_whole_chunk(frames):
    got = run(DelayedLockstep(0, 'previous', frames), 6)
    # d = 0: a frame every period, its chunk lands at once and replaces the previous one.
    assert [g[0] for g in got] == [(t, 0) for t in range(6)]
    assert all(g[2] for g in got)


def test_every_frame_starts_each_chunk_at_step_d_latest_wins():
    delay = DelayedLockstep(2, 'previous', 'every')
    got = run(delay, 7)
    assert [g[0] for g in got] == [None, None] + [(t - 2, 2) for t in range(2, 7)]
    assert [g[1] for g in got] == [0, 0] + [100 * (t - 2) + 2 for t in range(2, 7)]
    assert delay.num_chunk_steps_skipped == 2 * 5      # steps 0 and 1 of each landed chunk
    assert delay.num_chunks_replaced == 4 and delay.num_run_outs == 0


def test_one_in_flight_executes_the_planned_steps_on_time_then_holds():
    delay = DelayedLockstep(3, 'previous', 'one_in_flight')
    got = run(delay, 12)
    # Frames 0, 3, 6, 9; the chunk of frame t lands at t + 3 and covers t .. t + 3: step 3 is
    # applied at t + 3, then it has run out and the arm holds step 3 until the next chunk.
    assert [g[0] for g in got] == [None, None, None, (0, 3), None, None, (3, 3), None, None,
                                   (6, 3), None, None]
    assert [g[1] for g in got] == [0, 0, 0, 3, 3, 3, 303, 303, 303, 603, 603, 603]
    assert delay.num_run_outs == 3 and delay.num_chunks_replaced == 0

    got = run(DelayedLockstep(2, 'zero', 'one_in_flight'), 8)
    assert [g[0] for g in got] == [None, None, (0, 2), (0, 3), (2, 2), (2, 3), (4, 2), (4, 3)]


def test_a_chunk_landing_after_its_last_step_holds():
    delay = DelayedLockstep(5, 'zero', 'every')
    got = run(delay, 8)
    assert [g[0] for g in got] == [None] * 8
    assert all(g[1] == 0 and not g[2] for g in got)
    assert delay.num_fresh == 0 and delay.num_chunk_steps_skipped == 3 * K


def test_single_actions_keep_the_single_step_rule():
    delay = DelayedLockstep(2, 'previous', 'every')
    for t in range(4):
        delay.answer(t, plan(t)[0])            # (7,): applied when it lands
        delay.action_at(t)
        assert delay.source == (None if t < 2 else (t - 2, None))
    with pytest.raises(ValueError, match='chunk'):
        DelayedLockstep(0).answer(0, np.zeros((2, 6)))


PERIOD_S = 0.1
FRAME_NS = (1_000_000_007, 1_000_000_007 + 30_000_000)      # two frames 30 ms apart


def step_stamp(frame_ns: int, index: int) -> int:
    """The node's stamp of chunk step `index` (ros/message_time.offset_stamp)."""
    return frame_ns + round(index * PERIOD_S * 1e9)


def registry() -> FrameRegistry:
    frames = FrameRegistry()
    for stamp in FRAME_NS:
        frames.add(stamp, 0.0)
    return frames


def test_registry_traces_chunk_step_stamps_back_to_their_frame():
    frames = registry()
    assert frames.frame_of(FRAME_NS[1]) == (FRAME_NS[1], 0)
    assert frames.frame_of(step_stamp(FRAME_NS[0], 3)) is None      # without the period
    assert frames.frame_of(step_stamp(FRAME_NS[0], 3), PERIOD_S) == (FRAME_NS[0], 3)
    assert frames.frame_of(step_stamp(FRAME_NS[1], 2), PERIOD_S) == (FRAME_NS[1], 2)
    assert frames.frame_of(FRAME_NS[0] + 12345, PERIOD_S) is None   # a hold


def test_chunk_steps_pair_with_their_grippers_in_lockstep_and_real_time():
    matcher = LockstepMatcher(AnswerPairs(registry(), chunk_period_s=PERIOD_S))
    matcher.begin_frame(FRAME_NS[1])
    # Frame 0's chunk: steps 1 and 2 (each with its gripper) arrive while frame 1 waits,
    # then a hold (no gripper), then frame 1's step 0.
    for index, gripper in ((1, 0.1), (2, 0.2)):
        assert matcher.on_twist(step_stamp(FRAME_NS[0], index), (index, 0, 0), (0, 0, 0))
        matcher.on_gripper(gripper)
    assert not matcher.on_twist(FRAME_NS[1] + 12345, (0, 0, 0), (0, 0, 0))
    assert matcher.on_twist(FRAME_NS[1], (7, 0, 0), (0, 0, 0))
    matcher.on_gripper(0.7)
    command = matcher.take()
    assert (command.stamp_ns, command.step_index, command.linear[0],
            command.gripper_position) == (FRAME_NS[1], 0, 7, 0.7)
    assert matcher.num_other_answers == 2

    state = RealtimeCommand(AnswerPairs(registry(), chunk_period_s=PERIOD_S), 0.5, 1.0)
    state.begin_episode(FRAME_NS[0], 1.0)
    for index, gripper in ((0, 0.0), (1, 0.1), (2, 0.2)):
        state.on_twist(step_stamp(FRAME_NS[0], index), (index, 0, 0), (0, 0, 0), index * 0.1)
        state.on_gripper(gripper)
        assert state.command_at(index * 0.1) == ((index, 0, 0), (0, 0, 0), gripper, True)


def test_chunked_random_model_in_process_executes_time_aligned_steps(tmp_path):
    from test_closed_loop import SIM_REASON
    if SIM_REASON is not None:
        pytest.skip(f'simulator: {SIM_REASON}')
    os.environ.setdefault('MUJOCO_GL', 'osmesa')
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.harness import inprocess
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    folder = tmp_path / 'tiny-chunk4'
    make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=K), folder, seed=3)
    points = [inprocess.SweepPoint(action_delay=2), inprocess.SweepPoint(
        action_delay=2, delay_frames='one_in_flight')]
    every, one = inprocess.run_sweep(
        points, ['button-press-topdown'], 1, model=str(folder), unnorm_key='bridge_orig',
        seed=3, max_steps=6, progress=False, keep_actions=True,
        engine_options={'restrict_to_action_tokens': True})
    for report in (every, one):
        assert report.action_chunk == K and report.num_steps == 6
        (applied, tokens), = report.details
        assert len(applied) == 6 and all(len(t) == 7 * K for t in tokens)
    (sources,) = every.step_sources
    assert sources == [None, None, (0, 2), (1, 2), (2, 2), (3, 2)]
    assert every.num_actions == 6 and every.num_held == 2 and every.num_run_outs == 0
    (sources,) = one.step_sources
    assert sources == [None, None, (0, 2), (0, 3), (2, 2), (2, 3)]
    assert one.num_actions == 3 and one.num_chunk_steps_skipped == 2 * 2
    # The applied actions are the chunk's steps (gripper clipped as the bridge does).
    (applied, _), = one.details
    assert np.all(np.isfinite(np.array(applied)))
    assert report.to_dict()['action_chunk'] == K


@pytest.fixture(scope='module')
def chunked_folder(tmp_path_factory):
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    folder = tmp_path_factory.mktemp('models') / 'tiny-chunk4'
    make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=K), folder, seed=5)
    return folder


def test_demo_refuses_lockstep_for_a_chunked_model(chunked_folder):
    import argparse

    from vla_spec_ros.harness import demo, demo_options
    assert demo_options.action_chunk(str(chunked_folder)) == K
    assert demo_options.action_chunk('tiny') == 1
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    with pytest.raises(ValueError, match='lockstep: .* chunked model .*--parts delay'):
        demo.run(parser.parse_args(['--model', str(chunked_folder), '--parts', 'lockstep']))
    demo_options.check_lockstep_model(str(chunked_folder), 'realtime')
    with pytest.raises(ValueError, match='--delay-models'):
        demo_options.resolve_options(parser.parse_args(['--delay-models', 'tiny,tiny']))


def test_demo_delay_part_compares_single_step_and_chunked_models(chunked_folder, tmp_path):
    import argparse
    import json

    from test_closed_loop import SIM_REASON
    if SIM_REASON is not None:
        pytest.skip(f'simulator: {SIM_REASON}')
    from vla_spec_ros.harness import demo, demo_options
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    args = parser.parse_args([
        '--model', 'tiny', '--delay-models', f'tiny,{chunked_folder}', '--unnorm-key',
        'bridge_orig', '--tasks', 'button-press-topdown', '--parts', 'delay', '--delays', '0,2',
        '--max-steps', '3', '--workers', '1', '--restrict-to-action-tokens', '--out',
        str(tmp_path)])
    assert demo.run(args) == 0
    (path,) = tmp_path.glob('demo-*.json')
    record = json.loads(path.read_text())
    models = record['delay']['models']
    assert [m['action_chunk'] for m in models] == [1, K]
    assert record['delay']['points'] == models[0]['points']
    assert [len(m['points']) for m in models] == [3, 3]
    chunked = {(p['point']['action_delay'], p['point']['delay_frames']): p
               for p in models[1]['points']}
    # d = 2, one frame in flight, 3 steps: frame 0's chunk lands at 2 (steps 0, 1 skipped).
    assert chunked[(2, 'one_in_flight')]['num_chunk_steps_skipped'] == 2
    assert chunked[(2, 'one_in_flight')]['num_held'] == 2
    text = path.with_suffix('.md').read_text()
    assert 'tiny (single-step): every frame' in text and '(chunks of 4): one in flight' in text
