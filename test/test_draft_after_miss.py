"""The draft after a miss (ActionCodec.draft_after_miss, engine/packed.py): a request whose last
verification accepted none of its draft tokens gets at most `draft_after_miss` of them in its
next tree, a hit lifts the bound again, and the tokens stay AR's (float64, r = 0) whatever the
bound, in spec and pipeline_spec, on the tiny random pi0-FAST checkpoint (its drafts mostly
miss) with several bounds. The FAST codec itself sets none: its drafts continue by
coefficient after a miss (FastActionCodec.continue_draft) and keep being accepted."""
import pytest
import torch

from test_fast_drafts import consecutive_frames
from vla_spec_ros.codecs.fast import DRAFT_AFTER_MISS
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.models import registry

STATS = {'synthetic': {'action': {'q01': [-1.0] * 3, 'q99': [1.0] * 3}}}
NUM_FRAMES = 5


@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
    folder = registry.make_checkpoint('pi0fast-tiny', tmp_path_factory.mktemp('fast'), seed=3)
    return registry.load(folder, torch.float64)


@pytest.fixture(scope='module')
def expected(loaded):
    config = EngineConfig(dtype='float64', mode='ar')
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    return reference_tokens(runner, consecutive_frames(NUM_FRAMES), config)


def run(loaded, mode, draft_after_miss='codec'):
    """Each frame's tokens, and every drafted tree as (request id, whether its last draft
    missed, draft tokens in the tree)."""
    config = EngineConfig(dtype='float64', mode=mode, max_inflight=3)
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    engine = Engine(runner, STATS, config)
    strategy = engine.strategy
    if draft_after_miss != 'codec':
        strategy.draft_after_miss = draft_after_miss
    trees, draft_trees = [], strategy._draft_trees

    def recording(decode):
        missed = {r.request_id: r.draft_missed for r in decode}
        made = draft_trees(decode)
        trees.extend((rid, missed[rid], tree.num_nodes - 1) for rid, tree in made.items())
        return made
    strategy._draft_trees = recording
    out = []
    for frame in consecutive_frames(NUM_FRAMES):
        request_id = engine.submit(frame)
        results = {f.request_id: f for f in engine.run_until_idle()}
        assert results[request_id].error is None, results[request_id].error
        out.append(results[request_id].result.tokens)
    return out, trees


def test_the_fast_codec_leaves_the_draft_after_a_miss_unbounded(loaded):
    assert DRAFT_AFTER_MISS is None and loaded.codec.draft_after_miss is None


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
@pytest.mark.parametrize('bound', [0, 1, 2, None])
def test_tokens_are_ar_s_and_a_missed_draft_bounds_the_next(loaded, expected, mode, bound):
    tokens, trees = run(loaded, mode, bound)
    assert tokens == expected
    after_miss = [size for _, missed, size in trees if missed]
    assert after_miss, 'no draft missed: the test exercises nothing'
    if bound is None:        # no bound: a tree after a miss is as long as the chain goes
        assert max(after_miss) > 2
    else:
        assert max(after_miss) <= bound
    # A request whose last draft did not miss is not bounded.
    assert max(size for _, missed, size in trees if not missed) > 2
