"""S2 / S6 in float64 on CPU: the pipelined engine (ActionFlow-style cross-request packing over
the unified KV ring) gives every frame exactly the AR reference's tokens, in per-stream frame
order, with every frame emitted at most ``action_dim`` packed steps after its prefill, and no
frame left behind when arrivals stop (S2, S6 in docs/architecture.md).

The reference is ``VLAPolicy.predict`` in mode "ar" on the same frame. The expected admission
times in the irregular-arrival test come from the scheduler's stated contract (strict FIFO, one
prefill per packed step), modelled independently here.
"""
import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.policy import VLAPolicy

from reference import ar_reference_tokens

ACTION_DIM = 7
INSTRUCTIONS = ('push', 'pick up the red cup', 'open the top drawer of the cabinet then close '
                'it gently', 'lift the bowl', 'put the small yellow block on the large green '
                'plate quickly and carefully', 'press the button', 'slide the lid to the left')
NUM_FRAMES = 24


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('pipeline') / 'tiny', seed=2)
    return VLAPolicy.from_pretrained(str(folder), mode='ar', dtype='float64')


@pytest.fixture(scope='module')
def frames():
    rng = np.random.default_rng(11)
    out = []
    for i in range(NUM_FRAMES):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        out.append(Frame(rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                         INSTRUCTIONS[i % len(INSTRUCTIONS)], 'bridge_orig', 'cam0', i))
    return out


@pytest.fixture(scope='module')
def reference(policy, frames):
    """AR reference tokens per frame index (S1: the plain path of engine/ar.py)."""
    return ar_reference_tokens(policy, frames)


def test_engine_ar_mode_is_the_reference(policy, frames, reference):
    """Mode "ar" runs through the packed engine (ring, segments, static buffers): same tokens
    as the plain reference, one verifier forward per token."""
    engine = Engine(policy.engine.runner, policy.engine.norm_stats,
                    EngineConfig(mode='ar', dtype='float64'))
    for f in frames[:8]:
        engine.submit(f)
    finished = engine.run_until_idle()
    assert [fin.result.tokens for fin in finished] == reference[:8]
    assert engine.num_verifier_forwards == 8 * ACTION_DIM
    assert [policy.predict(f.image, f.instruction, f.unnorm_key).tokens
            for f in frames[8:11]] == reference[8:11]


def make_engine(policy, **options) -> Engine:
    config = EngineConfig(mode='pipeline', dtype='float64', **options)
    return Engine(policy.engine.runner, policy.engine.norm_stats, config)


def restream(frame: Frame, stream_id: str, unnorm_key: str = 'bridge_orig') -> Frame:
    return Frame(frame.image, frame.instruction, unnorm_key, stream_id, frame.user_data)


def saturating_run(engine: Engine, frames: list):
    """A camera faster than inference: a new frame is submitted whenever none is waiting.

    Returns (finished actions in emission order, request id -> step of its prefill,
    request id -> step it was emitted, number of steps).
    """
    pending = list(frames)
    finished, prefill_step, emit_step = [], {}, {}
    waiting_id, step = None, 0
    while pending or engine.has_work():
        if pending and not engine.has_waiting():
            waiting_id = engine.submit(pending.pop(0))
        was_waiting = engine.has_waiting()
        out = engine.step()
        if was_waiting and not engine.has_waiting():
            prefill_step[waiting_id] = step
        for fin in out:
            emit_step[fin.request_id] = step
        finished.extend(out)
        step += 1
    return finished, prefill_step, emit_step, step


def assert_matches_reference(finished, reference):
    for fin in finished:
        assert fin.error is None, fin.error
        assert fin.result.tokens == reference[fin.frame.user_data], fin.frame.user_data


def test_frames_have_different_prompt_lengths(policy, frames):
    runner = policy.engine.runner
    lengths = {runner.prefix_len(runner.validate_instruction(f.instruction)) for f in frames}
    assert len(lengths) >= 5


def test_pipeline_equals_ar_frame_by_frame_in_order(policy, frames, reference):
    engine = make_engine(policy)
    finished, prefill_step, emit_step, num_steps = saturating_run(engine, frames)
    assert [fin.frame.user_data for fin in finished] == list(range(NUM_FRAMES))
    assert_matches_reference(finished, reference)
    assert [fin.request_id for fin in finished] == sorted(fin.request_id for fin in finished)
    # S2 emission bound: at most action_dim packed steps from prefill to emission (inclusive).
    assert set(prefill_step) == set(emit_step)
    for rid, step in emit_step.items():
        assert 0 <= step - prefill_step[rid] <= ACTION_DIM - 1
    # Every request took part in action_dim forwards, but they were shared: when frames keep
    # coming, one packed forward per action plus the pipeline fill/drain.
    for fin in finished:
        assert fin.result.stats['forward_passes'] == ACTION_DIM
        assert fin.result.stats['mode'] == 'pipeline'
    assert engine.num_verifier_forwards == num_steps
    assert engine.num_verifier_forwards <= NUM_FRAMES + ACTION_DIM - 1
    assert engine.num_verifier_forwards / NUM_FRAMES < 2.0
    assert not engine.has_work()


def test_ar_takes_action_dim_forwards_per_action(policy, frames, reference):
    before = policy.engine.num_verifier_forwards
    result = policy.predict(frames[0].image, frames[0].instruction, 'bridge_orig')
    assert result.tokens == reference[0]
    assert policy.engine.num_verifier_forwards - before == ACTION_DIM
    assert result.stats['forward_passes'] == ACTION_DIM


def test_two_interleaved_streams(policy, frames, reference):
    engine = make_engine(policy)
    keys = {'left': 'bridge_orig', 'right': 'libero_goal'}
    streamed = [restream(f, 'left' if i % 3 != 1 else 'right',
                         keys['left' if i % 3 != 1 else 'right'])
                for i, f in enumerate(frames[:20])]
    finished, prefill_step, emit_step, _ = saturating_run(engine, streamed)
    assert len(finished) == 20
    assert_matches_reference(finished, reference)
    for stream in keys:
        order = [fin.frame.user_data for fin in finished if fin.frame.stream_id == stream]
        submitted = [f.user_data for f in streamed if f.stream_id == stream]
        assert order == submitted
        for fin in finished:
            if fin.frame.stream_id == stream:
                assert fin.result.stats['unnorm_key'] == keys[stream]
    for rid, step in emit_step.items():
        assert step - prefill_step[rid] <= ACTION_DIM - 1


def test_irregular_arrivals_force_decode_only_steps(policy, frames, reference):
    # Gaps (in engine ticks) between arrivals: bursts (0), short gaps, and gaps longer than
    # the pipeline depth so the pipeline drains completely.
    gaps = [0, 0, 0, 2, 9, 0, 1, 15, 3, 0, 0, 0, 0, 7, 1, 1, 20, 4, 0, 2, 0, 11]
    arrival, tick = [], 0
    for gap in gaps:
        tick += gap
        arrival.append(tick)
    rng = np.random.default_rng(3)
    streamed = [restream(frames[i], str(rng.choice(['a', 'b']))) for i in range(len(gaps))]
    engine = make_engine(policy)
    ids, emit_tick, finished = [], {}, []
    num_decode_only = num_idle = 0
    tick, next_frame = 0, 0
    while next_frame < len(streamed) or engine.has_work():
        while next_frame < len(streamed) and arrival[next_frame] == tick:
            ids.append(engine.submit(streamed[next_frame]))
            next_frame += 1
        if engine.has_work():
            if not engine.has_waiting():
                num_decode_only += 1
        else:
            num_idle += 1
        out = engine.step()            # with no work: returns nothing and runs no forward
        for fin in out:
            emit_tick[fin.request_id] = tick
        finished.extend(out)
        tick += 1
        assert tick < 1000
    assert num_decode_only > 0 and num_idle > 0
    assert sorted(fin.request_id for fin in finished) == ids        # every frame finished
    assert_matches_reference(finished, reference)
    for stream in ('a', 'b'):
        order = [fin.frame.user_data for fin in finished if fin.frame.stream_id == stream]
        assert order == sorted(order)
    # Strict FIFO, one prefill per packed step: frame k starts at max(arrival_k, start_k-1 + 1)
    # and, with plain decoding, is emitted action_dim - 1 steps later at the latest (S2, S6).
    start = -1
    for k, rid in enumerate(ids):
        start = max(arrival[k], start + 1)
        assert emit_tick[rid] <= start + ACTION_DIM - 1, k


@pytest.mark.parametrize('max_inflight', [1, 3])
def test_max_inflight(policy, frames, reference, max_inflight):
    engine = make_engine(policy, max_inflight=max_inflight)
    subset = frames[:6]
    for f in subset:
        engine.submit(f)                # all at once: the queue is never empty
    finished, num_steps = [], 0
    while engine.has_work():
        finished.extend(engine.step())
        num_steps += 1
    assert [fin.frame.user_data for fin in finished] == list(range(6))
    assert_matches_reference(finished, reference)
    if max_inflight == 1:
        # Plain AR latency: one request at a time, action_dim forwards each.
        assert num_steps == engine.num_verifier_forwards == ACTION_DIM * len(subset)
    else:
        assert engine.num_verifier_forwards < ACTION_DIM * len(subset)


@pytest.mark.parametrize('mode, per_stream, limit', [
    ('pipeline', 0, 7), ('pipeline', 3, 3), ('pipeline_spec', 0, 1), ('pipeline_spec', 5, 5),
    ('pipeline', 9, 7), ('ar', 0, 1), ('spec', 4, 1)])
def test_stream_inflight_limit_resolves_the_mode_default(mode, per_stream, limit):
    cfg = EngineConfig(mode=mode, max_inflight=7, max_inflight_per_stream=per_stream)
    assert cfg.stream_inflight_limit == limit
    with pytest.raises(ValueError, match='max_inflight_per_stream'):
        EngineConfig(max_inflight_per_stream=-1)


@pytest.mark.parametrize('mode', ['pipeline', 'pipeline_spec'])
def test_one_camera_never_has_more_than_its_limit_in_flight(policy, frames, reference, mode):
    """max_inflight_per_stream 3 with max_inflight 7: one camera whose frames are all queued
    keeps at most 3 in flight (the engine's own count after every step) and gets AR's tokens
    in order."""
    config = EngineConfig(mode=mode, dtype='float64', max_inflight_per_stream=3,
                          **({'draft_path': 'random'} if mode == 'pipeline_spec' else {}))
    engine = Engine(policy.engine.runner, policy.engine.norm_stats, config)
    subset = frames[:10]
    for f in subset:
        engine.submit(f)
    finished, most = [], 0
    while engine.has_work():
        finished.extend(engine.step())
        most = max(most, engine.num_inflight)
    assert most == 3
    assert [fin.frame.user_data for fin in finished] == list(range(10))
    assert_matches_reference(finished, reference)


def test_max_streams_refuses_a_stream_beyond_the_limit_until_one_finishes(policy, frames,
                                                                          reference):
    engine = make_engine(policy, max_streams=2)
    engine.submit(restream(frames[0], 'a'))
    engine.submit(restream(frames[1], 'b'))
    engine.submit(restream(frames[2], 'a'))              # a known stream is always welcome
    with pytest.raises(ValueError, match='max_streams is 2'):
        engine.submit(restream(frames[3], 'c'))
    finished = engine.run_until_idle()
    assert [f.result.tokens for f in finished] == [reference[i] for i in (0, 1, 2)]
    engine.submit(restream(frames[3], 'c'))              # streams a and b are done now
    assert engine.run_until_idle()[0].result.tokens == reference[3]


def test_drop_waiting_keeps_in_flight_frames(policy, frames, reference):
    engine = make_engine(policy)
    first = engine.submit(restream(frames[0], 'a'))
    engine.step()                                          # frames[0] is in flight
    dropped = [engine.submit(restream(frames[i], 'a')) for i in (1, 2)]
    kept = engine.submit(restream(frames[3], 'b'))
    assert engine.drop_waiting('a') == dropped
    assert engine.drop_waiting('a') == []
    finished = engine.run_until_idle()
    assert [fin.request_id for fin in finished] == [first, kept]
    assert_matches_reference(finished, reference)


def test_drop_waiting_then_new_frame_of_the_same_stream(policy, frames, reference):
    engine = make_engine(policy)
    stale = engine.submit(restream(frames[4], 'a'))
    assert engine.drop_waiting('a') == [stale]
    assert not engine.has_work()
    fresh = engine.submit(restream(frames[5], 'a'))        # latest wins
    finished = engine.run_until_idle()
    assert [fin.request_id for fin in finished] == [fresh]
    assert_matches_reference(finished, reference)


def test_replace_waiting_keeps_the_stream_place_and_refuses_bad_frames(policy, frames,
                                                                       reference):
    """The node's latest-wins replacement: the newest frame takes the replaced frame's place
    in the queue (ahead of the frames queued after it), its tokens are the reference; a bad
    frame replaces nothing."""
    engine = make_engine(policy, max_inflight=1)
    first = engine.submit(restream(frames[0], 'a'))
    engine.step()                                          # frames[0] is in flight
    stale = engine.submit(restream(frames[1], 'b'))        # b waits first, then c
    other = engine.submit(restream(frames[2], 'c'))
    bad = Frame(frames[3].image[:, :, :2], frames[3].instruction, 'bridge_orig', 'b')
    with pytest.raises(ValueError, match='image'):
        engine.replace_waiting(bad)
    assert engine.waiting_streams == frozenset({'b', 'c'})
    fresh, replaced = engine.replace_waiting(restream(frames[4], 'b'))
    assert replaced == [stale]
    finished = engine.run_until_idle()
    assert [fin.request_id for fin in finished] == [first, fresh, other]
    assert_matches_reference(finished, reference)


def test_reset_one_stream_then_all(policy, frames, reference):
    engine = make_engine(policy)
    a_ids = [engine.submit(restream(frames[i], 'a')) for i in (6, 7, 8)]
    b_ids = [engine.submit(restream(frames[i], 'b')) for i in (9, 10)]
    for _ in range(3):
        assert engine.step() == []             # a6, a7, a8 in flight, b9 / b10 waiting
    assert engine.reset('a') == a_ids
    finished = engine.run_until_idle()
    assert [fin.request_id for fin in finished] == b_ids
    assert_matches_reference(finished, reference)
    # Reset everything mid-flight, then the engine (and its ring) serve new frames correctly.
    ids = [engine.submit(restream(frames[i], s)) for i, s in ((11, 'a'), (12, 'b'), (13, 'a'))]
    engine.step()
    engine.step()
    assert engine.reset() == ids
    assert not engine.has_work() and not engine.has_waiting()
    assert engine.step() == []
    new = [engine.submit(restream(frames[i], 'a')) for i in (14, 15)]
    finished = engine.run_until_idle()
    assert [fin.request_id for fin in finished] == new
    assert_matches_reference(finished, reference)


@pytest.mark.parametrize('mode', ['pipeline', 'ar'])
def test_error_inside_step_is_reported_not_raised(policy, frames, reference, monkeypatch, mode):
    runner = policy.engine.runner
    if mode == 'ar':
        engine = Engine(runner, policy.engine.norm_stats, EngineConfig(mode='ar', dtype='float64'))
    else:
        engine = make_engine(policy)
    verifier = engine.strategy.verifier
    real_forward = verifier.run
    state = {'calls': 0, 'fail_at': 2}

    def flaky_forward(*args, **kwargs):
        state['calls'] += 1
        if state['calls'] == state['fail_at']:
            raise RuntimeError('simulated device fault')
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(verifier, 'run', flaky_forward)
    ids = [engine.submit(restream(frames[i], 'a')) for i in (16, 17, 18)]
    reported, steps = [], 0
    while engine.has_work():
        reported.extend(engine.step())          # must not raise
        steps += 1
        assert steps < 100
    errors = [fin for fin in reported if fin.error is not None]
    assert errors, 'the failed step reported nothing'
    for fin in errors:
        assert 'simulated device fault' in fin.error and fin.result is None
    # Every submitted frame is accounted for: an action or an error, never silently lost.
    assert sorted(fin.request_id for fin in reported) == ids
    assert_matches_reference([fin for fin in reported if fin.error is None], reference)
    # The engine keeps serving after the fault.
    state['fail_at'] = -1
    new = engine.submit(restream(frames[19], 'a'))
    finished = engine.run_until_idle()
    assert [fin.request_id for fin in finished] == [new]
    assert_matches_reference(finished, reference)


@pytest.mark.parametrize('mode', ['ar', 'pipeline', 'spec', 'pipeline_spec'])
def test_dense_reference_attention_gives_the_same_tokens(mode, tmp_path_factory):
    """attention_backend "dense" (one T x ring mask: the reference) equals the segment path and
    the plain AR reference, on random frames, in every mode (the pipeline modes with two
    prompts of different lengths per step)."""
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('dense') / 'tiny', seed=4)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64')
    rng = np.random.default_rng(8)
    frames = [Frame(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8), text, 'bridge_orig')
              for text in ('open the drawer', 'push the red block to the left', 'close it',
                           'press the button', 'lift the bowl')]
    expected = ar_reference_tokens(policy, frames)
    runner = policy.engine.runner
    for backend in ('dense', 'segments'):
        cfg = EngineConfig(mode=mode, dtype='float64', attention_backend=backend,
                           draft_path='random', tree_depth=3, tree_top_k=2, tree_max_nodes=6,
                           max_prefills_per_step=2)
        draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
        engine = Engine(runner, policy.engine.norm_stats, cfg, draft=draft)
        assert engine.strategy.verifier.is_dense == (backend == 'dense')
        for f in frames:
            engine.submit(f)
        got = {fin.request_id: fin.result.tokens for fin in engine.run_until_idle()}
        assert [got[i] for i in sorted(got)] == expected, backend


@pytest.mark.parametrize('max_prefills', [2, 3])
def test_several_prefills_per_step_keep_the_ar_tokens_with_fewer_steps(policy, frames,
                                                                       reference, max_prefills):
    """Three streams with frames always waiting: up to ``max_prefills`` prompts (of different
    lengths) share each packed step. Every frame still gets its AR tokens, each stream in
    order, and the frames take fewer steps than one admission per step allows."""
    streamed = [restream(f, 'abc'[i % 3]) for i, f in enumerate(frames[:18])]
    steps = {}
    for prefills in (1, max_prefills):
        engine = make_engine(policy, max_prefills_per_step=prefills)
        for f in streamed:
            engine.submit(f)
        finished, admitted_together = [], 0
        while engine.has_work():
            waiting_before = engine.strategy.scheduler.num_waiting
            finished.extend(engine.step())
            admitted_together = max(admitted_together,
                                    waiting_before - engine.strategy.scheduler.num_waiting)
        assert len(finished) == len(streamed)
        assert_matches_reference(finished, reference)
        for stream in 'abc':
            order = [fin.frame.user_data for fin in finished if fin.frame.stream_id == stream]
            assert order == sorted(order)
        assert admitted_together == prefills
        steps[prefills] = engine.num_verifier_forwards
    assert steps[max_prefills] < steps[1]


def test_max_prefills_per_step_is_checked_against_max_inflight():
    for mode in ('pipeline', 'pipeline_spec'):
        with pytest.raises(ValueError, match='max_prefills_per_step: 4 exceeds max_inflight 3'):
            EngineConfig(mode=mode, max_inflight=3, max_prefills_per_step=4)
    with pytest.raises(ValueError, match='max_prefills_per_step'):
        EngineConfig(mode='pipeline', max_prefills_per_step=0)
    # One frame in flight at a time in ar / spec: the setting does not apply there, so one
    # YAML serves every mode.
    assert EngineConfig(mode='spec', max_inflight=1, max_prefills_per_step=2).mode == 'spec'
