"""Preparing the next frame's prompt during the verifier forward (``prefetch_prompt``), float64
on CPU: every mode still gives the AR reference's tokens, the frames that can be prepared
ahead are, and a prepared frame that is dropped before its admission takes its prompt with it.

Which frames are prepared ahead follows from the rule stated in ``PackedStrategy``: during a
step, the oldest waiting frame is prepared when the step's requests with one token left will
free a place in flight for it (AR: the last decode step of the frame in flight; pipelining
with free places: every step that leaves a frame waiting). A camera offering one frame at a
time gives pipelining nothing to prepare: the waiting frame is admitted by the next step
itself. A backlog (frames submitted together) does.
"""
import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.drafter import load_draft_for
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.random_checkpoint import make_checkpoint
from vla_spec_ros.policy import VLAPolicy

from reference import ar_reference_tokens

INSTRUCTIONS = ('push', 'pick up the red cup', 'open the top drawer of the cabinet',
                'lift the bowl')
NUM_FRAMES = 10


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('prefetch') / 'tiny', seed=4)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


@pytest.fixture(scope='module')
def frames():
    rng = np.random.default_rng(5)
    return [Frame(rng.integers(0, 256, (int(rng.integers(40, 80)), 64, 3), dtype=np.uint8),
                  INSTRUCTIONS[i % len(INSTRUCTIONS)], 'bridge_orig', 'cam0', i)
            for i in range(NUM_FRAMES)]


@pytest.fixture(scope='module')
def reference(policy, frames):
    return ar_reference_tokens(policy, frames)


def make_engine(policy, mode: str, prefetch: str = 'on', **options) -> Engine:
    config = EngineConfig(mode=mode, dtype='float64', prefetch_prompt=prefetch, **options)
    runner = policy.engine.runner
    draft = load_draft_for(runner, config.replace(draft_path='random'), None) \
        if config.is_speculative else None
    return Engine(runner, policy.engine.norm_stats, config, draft=draft)


def run_backlog(engine: Engine, frames) -> list:
    """Every frame submitted at once (one stream), then stepped until idle."""
    for frame in frames:
        engine.submit(frame)
    return engine.run_until_idle()


def run_one_waiting(engine: Engine, frames) -> list:
    """A camera faster than inference: a new frame whenever none waits."""
    pending, out = list(frames), []
    while pending or engine.has_work():
        if pending and not engine.has_waiting():
            engine.submit(pending.pop(0))
        out.extend(engine.step())
    return out


@pytest.mark.parametrize('mode', ['ar', 'pipeline', 'spec', 'pipeline_spec'])
def test_prefetched_prompts_give_the_reference_tokens(policy, frames, reference, mode):
    engine = make_engine(policy, mode, tree_depth=2, tree_top_k=3, tree_max_nodes=6)
    out = run_backlog(engine, frames)
    assert [fin.error for fin in out] == [None] * NUM_FRAMES
    assert [fin.result.tokens for fin in out] == reference
    assert engine.strategy.stats.num_prefetched >= 1


@pytest.mark.parametrize('mode', ['ar', 'pipeline'])
def test_every_frame_but_the_first_is_prepared_ahead(policy, frames, reference, mode):
    """AR: each frame is prepared during its predecessor's last decode step; pipelining with
    places free: during the step that admits its predecessor."""
    engine = make_engine(policy, mode)
    out = run_backlog(engine, frames)
    assert [fin.result.tokens for fin in out] == reference
    assert engine.strategy.stats.num_prefetched == NUM_FRAMES - 1


@pytest.mark.parametrize('mode,num_prefetched', [('ar', NUM_FRAMES - 1), ('pipeline', 0)])
def test_one_waiting_frame_is_prepared_ahead_in_ar_only(policy, frames, reference, mode,
                                                        num_prefetched):
    engine = make_engine(policy, mode)
    out = run_one_waiting(engine, frames)
    assert [fin.result.tokens for fin in out] == reference
    assert engine.strategy.stats.num_prefetched == num_prefetched


def test_no_prefetch_when_the_pipeline_stays_full(policy, frames, reference):
    """Two places, seven tokens each: while both requests have more than one token left, the
    waiting frame is not sure to be admitted next step, so it is not prepared."""
    engine = make_engine(policy, 'pipeline', max_inflight=2)
    for frame in frames[:3]:
        engine.submit(frame)
    engine.step()          # admits frame 0; frame 1 may be admitted next: prepared
    assert engine.strategy.stats.num_prefetched == 0
    engine.step()          # admits frame 1 (prepared); both in flight with 6 and 7 tokens left
    assert engine.strategy.stats.num_prefetched == 1
    assert engine.strategy.scheduler.next_waiting().prompt is None
    out = engine.run_until_idle()
    assert [fin.result.tokens for fin in out] == reference[:3]
    # Frame 2 was prepared during frame 0's last step only.
    assert engine.strategy.stats.num_prefetched == 2


def test_off_and_auto_on_a_cpu_never_prepare_ahead(policy, frames, reference):
    for prefetch in ('off', 'auto'):
        engine = make_engine(policy, 'pipeline', prefetch)
        out = run_backlog(engine, frames[:4])
        assert [fin.result.tokens for fin in out] == reference[:4]
        assert engine.strategy.stats.num_prefetched == 0


def test_a_dropped_prepared_frame_takes_its_prompt_with_it(policy, frames, reference):
    """AR: frame 1 is prepared during frame 0's last step, then replaced by frame 2 before
    its admission (latest wins): frame 2 gets its own prompt."""
    engine = make_engine(policy, 'ar')
    first = engine.submit(frames[0])
    stale = engine.submit(Frame(frames[1].image, frames[1].instruction, 'bridge_orig', 'cam1'))
    for _ in range(7):
        out = engine.step()
    assert [fin.request_id for fin in out] == [first]
    assert engine.strategy.scheduler.next_waiting().prompt is not None    # prepared ahead
    assert engine.drop_waiting('cam1') == [stale]
    fresh = engine.submit(Frame(frames[2].image, frames[2].instruction, 'bridge_orig', 'cam1'))
    out = engine.run_until_idle()
    assert [fin.request_id for fin in out] == [fresh]
    assert out[0].result.tokens == reference[2]
    assert engine.strategy.stats.num_prefetched == 0


def test_prefetch_prompt_accepts_only_auto_on_off():
    with pytest.raises(ValueError, match='prefetch_prompt'):
        EngineConfig(prefetch_prompt='yes')
