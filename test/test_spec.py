"""S3 / S4 / S5 through the engine (float64, CPU): speculative modes against the AR reference.

Strict speculation (relax_threshold = 0) must reproduce the AR tokens for any tree shape, with a
deliberately bad (random) draft head and with a perfect (oracle) one; the oracle must decide all
action_dim tokens in one prefill + one verify. Relaxed acceptance keeps the drafted tokens.
"""
import dataclasses

import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.testing import OracleDrafter

from helpers import sharpen_draft_head
from reference import ar_reference_tokens

INSTRUCTIONS = ('pick up the red cup', 'open the drawer', 'close it',
                'push the blue block to the left of the table')


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('spec') / 'tiny', seed=1)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


@pytest.fixture(scope='module')
def frames_and_reference(policy):
    rng = np.random.default_rng(11)
    frames = [Frame(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8),
                    INSTRUCTIONS[i % len(INSTRUCTIONS)], 'bridge_orig', f'cam{i % 2}')
              for i in range(50)]
    reference = ar_reference_tokens(policy, frames)
    return frames, reference


def run_stream(engine, frames):
    """Saturating camera: offer a frame whenever none waits; collect results in emit order."""
    pending, out = list(frames), []
    while pending or engine.has_work():
        if pending and not engine.has_waiting():
            engine.submit(pending.pop(0))
        for fin in engine.step():
            assert fin.error is None, fin.error
            out.append(fin)
    return out


def tokens_by_request(out):
    """Tokens in request-id order, after checking each stream was emitted in submission
    order (frames of different streams may finish in any order)."""
    streams = {}
    for fin in out:
        streams.setdefault(fin.frame.stream_id, []).append(fin.request_id)
    for ids in streams.values():
        assert ids == sorted(ids)
    return [fin.result.tokens for fin in sorted(out, key=lambda f: f.request_id)]


def make_engine(policy, draft, **options):
    """An engine over ``policy``'s runner with ``draft`` ('random': the seeded random head;
    None: the drafter the options' draft_path names; a Drafter object: that one, with
    draft_path 'random' in the config unless given, so the config's rules for the default
    previous-action drafter do not apply to a test double)."""
    if draft is not None and not isinstance(draft, str):
        options.setdefault('draft_path', 'random')
    cfg = EngineConfig(dtype='float64', **options)
    runner = policy.engine.runner
    if draft == 'random':
        draft = load_draft_for(runner, cfg.replace(draft_path='random'), None)
    elif draft is None and cfg.is_speculative:      # the drafter cfg.draft_path names
        draft = load_draft_for(runner, cfg, None)
    return Engine(runner, policy.engine.norm_stats, cfg, draft=draft)


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
@pytest.mark.parametrize('depth,top_k,max_nodes', [(1, 1, 2), (2, 8, 20), (5, 3, 12),
                                                   (4, 8, 50)])
def test_strict_speculation_with_random_draft_equals_ar(policy, frames_and_reference, mode,
                                                        depth, top_k, max_nodes):
    frames, reference = frames_and_reference
    count = 50 if (depth, top_k) == (4, 8) else 16
    engine = make_engine(policy, 'random', mode=mode, tree_depth=depth, tree_top_k=top_k,
                         tree_max_nodes=max_nodes)
    out = run_stream(engine, frames[:count])
    assert tokens_by_request(out) == reference[:count]      # S3 tokens, S5 per-stream order


def test_step_stats_split_drafting_into_forwards_and_host_work(policy, frames_and_reference):
    """The drafting time of a step splits into the draft forwards (upload to host read,
    timed by the drafter) and the drafter's host bookkeeping, both accounted per step."""
    frames, _ = frames_and_reference
    engine = make_engine(policy, 'random', mode='pipeline_spec', tree_depth=3, tree_top_k=4,
                         tree_max_nodes=12)
    run_stream(engine, frames[:6])
    stats, draft = engine.strategy.stats, engine.strategy.drafter
    assert draft.num_forward_passes > 0 and draft.forward_s > 0
    assert stats.draft_forward_s == pytest.approx(draft.forward_s)
    assert 0 < stats.draft_forward_s < stats.draft_s
    assert stats.draft_host_s == pytest.approx(stats.draft_s - stats.draft_forward_s)
    per_step = stats.per_step_ms()
    assert per_step['draft_host_ms'] == pytest.approx(
        stats.draft_host_s / stats.num_steps * 1e3)


def confident_random_draft(policy, cfg):
    """The seeded random draft head, sharpened (``helpers.sharpen_draft_head``)."""
    draft = load_draft_for(policy.engine.runner, cfg.replace(draft_path='random'), None)
    sharpen_draft_head(draft.head)
    return draft


def record_trees(draft) -> list:
    """Every tree ``draft`` proposes from now on, appended to the returned list."""
    trees, propose = [], draft.propose_batch

    def recording(*args, **kwargs):
        batch = propose(*args, **kwargs)
        trees.extend(batch)
        return batch
    draft.propose_batch = recording
    return trees


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_confidence_pruning_keeps_ar_tokens_with_fewer_draft_forwards(
        policy, frames_and_reference, mode):
    """S3 with ``tree_min_prob``: pruned trees (down to the root alone at 1.0) still give the AR
    tokens, and pruning skips draft levels that the unpruned tree runs."""
    frames, reference = frames_and_reference
    options = dict(mode=mode, tree_depth=4, tree_top_k=4, tree_max_nodes=20)
    forwards, nodes = {}, {}
    for min_prob in (0.0, 0.7, 1.0):
        cfg = EngineConfig(dtype='float64', tree_min_prob=min_prob, **options)
        draft = confident_random_draft(policy, cfg)
        engine = make_engine(policy, draft, tree_min_prob=min_prob, **options)
        verified = record_trees(draft)
        out = run_stream(engine, frames[:16])
        assert tokens_by_request(out) == reference[:16]
        assert all(np.exp(min(t.scores)) >= min_prob for t in verified)
        forwards[min_prob] = draft.num_forward_passes
        nodes[min_prob] = sum(t.num_nodes for t in verified) / len(verified)
    assert forwards[1.0] < forwards[0.7] < forwards[0.0]
    assert nodes[1.0] < nodes[0.7] < nodes[0.0]


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_oracle_draft_decides_whole_action_in_prefill_plus_one_verify(policy,
                                                                      frames_and_reference,
                                                                      mode):
    frames, reference = frames_and_reference
    action_dim = policy.model_config.action_dim
    oracle = OracleDrafter(lambda rid: reference[rid], action_dim)
    engine = make_engine(policy, oracle, mode=mode, tree_depth=action_dim - 1, tree_top_k=1,
                         tree_max_nodes=action_dim)
    out = run_stream(engine, frames)
    assert tokens_by_request(out) == reference
    for fin in out:
        assert fin.result.stats['forward_passes'] == 2
        assert fin.result.stats['accepted_lengths'] == [1, action_dim - 1]


def test_partially_wrong_oracle_still_gives_ar_tokens(policy, frames_and_reference):
    frames, reference = frames_and_reference
    oracle = OracleDrafter(lambda rid: reference[rid], 7, error_rate=0.5, seed=3)
    engine = make_engine(policy, oracle, mode='pipeline_spec', tree_depth=5, tree_top_k=1,
                         tree_max_nodes=6)
    out = run_stream(engine, frames[:20])
    assert tokens_by_request(out) == reference[:20]
    lengths = [n for f in out for n in f.result.stats['accepted_lengths'][1:]]
    assert 1 < np.mean(lengths) < 6     # some drafts rejected, some accepted


def test_relaxed_acceptance_keeps_drafted_tokens(policy):
    """With action-only argmax and r = 255 (every action bin is "close"), drafts one bin off
    the reference are all accepted and kept as drafted; at r = 0 the same drafts are rejected
    and the AR tokens come out."""
    rng = np.random.default_rng(2)
    frames = [Frame(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8), 'open the drawer',
                    'libero_goal') for _ in range(6)]
    ar = make_engine(policy, None, mode='ar', restrict_to_action_tokens=True)
    reference = [f.result.tokens for f in run_stream(ar, frames)]
    at = policy.engine.runner.codec
    for r, expect_relaxed in ((0, False), (255, True)):
        oracle = OracleDrafter(lambda rid: reference[rid], 7, error_rate=1.0)
        engine = make_engine(policy, oracle, mode='spec', relax_threshold=r, tree_depth=6,
                             tree_top_k=1, tree_max_nodes=7, restrict_to_action_tokens=True)
        out = run_stream(engine, frames)
        for fin, ref in zip(out, reference):
            tokens = fin.result.tokens
            assert tokens[0] == ref[0]          # the prefill token is the verifier's own
            if expect_relaxed:
                assert fin.result.stats['forward_passes'] == 2
                # drafted tokens are the reference's neighbours (one bin off) and are kept
                assert all(abs(at.token_to_bin(t) - at.token_to_bin(u)) == 1
                           for t, u in zip(tokens[1:6], ref[1:6]))
                assert tokens[1:6] != ref[1:6]
            else:
                assert tokens == ref


def test_tunables_change_between_frames(policy, frames_and_reference):
    frames, reference = frames_and_reference
    engine = make_engine(policy, 'random', mode='pipeline_spec', tree_max_nodes=20)
    first = run_stream(engine, frames[:3])
    engine.set_tunables(tree_depth=2, tree_top_k=2, tree_max_nodes=5, relax_threshold=0)
    second = run_stream(engine, frames[3:6])
    assert tokens_by_request(first) + tokens_by_request(second) == reference[:6]
    with pytest.raises(ValueError, match='tree_max_nodes'):
        engine.set_tunables(tree_max_nodes=40)      # more than the scratch reserved at load
    with pytest.raises(ValueError, match='relax_threshold'):
        engine.set_tunables(relax_threshold=-1)
    with pytest.raises(ValueError, match='tree_min_prob'):
        engine.set_tunables(tree_min_prob=1.5)
    engine.set_tunables(tree_min_prob=0.5)
    assert tokens_by_request(run_stream(engine, frames[6:9])) == reference[6:9]
    with pytest.raises(ValueError, match='cannot change at run time'):
        engine.set_tunables(device='cuda')


def test_tunables_apply_from_the_next_admitted_frame(tmp_path_factory):
    """A relax_threshold change reaches frames admitted after it, never one part-way through
    its action: frames already in flight keep the threshold they were admitted under."""
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('tunables') / 'tiny', seed=5)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64',
                                       restrict_to_action_tokens=True)
    rng = np.random.default_rng(4)
    frames = [Frame(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8), 'open the drawer',
                    'bridge_orig') for _ in range(5)]
    reference = ar_reference_tokens(policy, frames)
    at = policy.engine.runner.codec
    # Every draft token is a wrong action token: strict decoding rejects them all, r = 255
    # accepts them all, so the two thresholds give different tokens.
    draft = OracleDrafter(reference.__getitem__, 7, error_rate=1.0,
                          wrong_tokens=range(at.first_action_id, at.last_action_id + 1))
    engine = Engine(policy.engine.runner, policy.engine.norm_stats,
                    EngineConfig(mode='pipeline_spec', dtype='float64', tree_depth=3,
                                 tree_top_k=1, tree_max_nodes=4, draft_path='random',
                                 restrict_to_action_tokens=True,
                                 max_inflight_per_stream=2),      # one camera, 2 in flight
                    draft=draft)
    for f in frames:
        engine.submit(f)
    finished = engine.step() + engine.step()            # frames 0 and 1 admitted at r = 0
    engine.set_tunables(relax_threshold=255)
    finished += engine.run_until_idle()
    got = {fin.request_id: fin.result.tokens for fin in finished}
    assert [got[0], got[1]] == reference[:2]
    assert [got[i] for i in range(2, 5)] != reference[2:]


def test_several_prefills_per_step_keep_the_ar_tokens(policy, frames_and_reference):
    """pipeline_spec with up to three prompts admitted per step (frames of two streams always
    waiting): the batched draft update begins several draft lanes in one forward (each from
    its own prompt's verifier features), and every request proposes exactly the trees it
    proposes with one admission per step; tokens stay the AR tokens, in fewer steps."""
    frames, reference = frames_and_reference
    # Two cameras and three prefills per step: each camera may have several frames in flight.
    options = dict(mode='pipeline_spec', tree_depth=4, tree_top_k=4, tree_max_nodes=20,
                   max_inflight_per_stream=7)
    steps, trees = {}, {}
    for prefills in (1, 3):
        cfg = EngineConfig(dtype='float64', max_prefills_per_step=prefills, **options)
        draft = confident_random_draft(policy, cfg)
        engine = make_engine(policy, draft, max_prefills_per_step=prefills, **options)
        trees[prefills] = per_request_trees(draft)
        admitted = record_admissions(engine)
        for f in frames[:24]:
            engine.submit(f)
        out = engine.run_until_idle()
        assert tokens_by_request(out) == reference[:24]
        steps[prefills] = engine.num_verifier_forwards
        assert max(len(a) for a in admitted) == prefills
    assert any(len(set(a)) >= 2 for a in admitted)      # prompts of different lengths together
    assert steps[3] < steps[1]
    assert trees[3].keys() == trees[1].keys()
    for request_id, proposed in trees[1].items():
        assert [(t.tokens, t.parents) for t in trees[3][request_id]] == \
            [(t.tokens, t.parents) for t in proposed], request_id
        for a, b in zip(trees[3][request_id], proposed):
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9, atol=1e-9)


def per_request_trees(draft) -> dict:
    """Every tree ``draft`` proposes from now on, per request id, in order."""
    trees, propose = {}, draft.propose_batch

    def recording(request_ids, *args, **kwargs):
        batch = propose(request_ids, *args, **kwargs)
        for request_id, tree in zip(request_ids, batch):
            trees.setdefault(request_id, []).append(tree)
        return batch
    draft.propose_batch = recording
    return trees


def record_admissions(engine) -> list:
    """Per step from now on, the prompt lengths of the requests it admits."""
    admitted, schedule = [], engine.strategy.scheduler.schedule

    def recording():
        work = schedule()
        admitted.append([r.prefix_len for r in work.prefills])
        return work
    engine.strategy.scheduler.schedule = recording
    return admitted


def test_padded_draft_shapes_propose_the_same_trees(policy, frames_and_reference, monkeypatch):
    """The draft forwards padded to their shape buckets (what CUDA graphs capture and replay:
    prompt blocks, segment counts, accepted-path rows, level rows of frontiers pruned below
    top_k, gathered slots, features) propose every request's trees as the tight shapes do,
    through pipeline_spec with two prompts per step, and a handful of buckets serves every
    step."""
    from vla_spec_ros.engine.drafting.eagle_drafter import EagleDrafter
    frames, reference = frames_and_reference
    options = dict(mode='pipeline_spec', max_prefills_per_step=2, tree_depth=4, tree_top_k=4,
                   tree_max_nodes=20, tree_min_prob=0.05)   # pruned frontiers: padded levels
    cfg = EngineConfig(dtype='float64', **options)
    head = confident_random_draft(policy, cfg).head
    trees, buckets = {}, {}
    for pad in (False, True):
        draft = EagleDrafter(policy.engine.runner, head, num_lanes=cfg.max_inflight,
                             pad_shapes=pad)
        engine = make_engine(policy, draft, **options)
        trees[pad] = per_request_trees(draft)
        if pad:
            level_rows = record_level_frontiers(monkeypatch)
        for f in frames[:20]:
            engine.submit(f)
        assert tokens_by_request(engine.run_until_idle()) == reference[:20]
        buckets[pad] = draft.forward.num_buckets
    for request_id, proposed in trees[False].items():
        assert [(t.tokens, t.parents) for t in trees[True][request_id]] == \
            [(t.tokens, t.parents) for t in proposed], request_id
        for a, b in zip(trees[True][request_id], proposed):
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9, atol=1e-9)
    assert buckets[True] < buckets[False]
    assert any(n < options['tree_top_k'] for n in level_rows)    # a level row was padding


def record_level_frontiers(monkeypatch) -> list:
    """The frontier size of every tree level fed to a draft forward from now on (the root's
    own expansion, from the last update's proposals, is not a level forward)."""
    from vla_spec_ros.engine.drafting.draft_tree import ROOT
    from vla_spec_ros.engine.drafting.tree_growth import TreeGrowth
    sizes, expand = [], TreeGrowth.expand

    def recording(growth, values, tokens):
        if growth.frontier[0] != ROOT:
            sizes.append(growth.frontier.size)
        return expand(growth, values, tokens)
    monkeypatch.setattr(TreeGrowth, 'expand', recording)
    return sizes


# ---- temporal drafting: each stream's previous action
# (engine/drafting/previous_action_drafter.py)

def temporal_stream(frames, reference, repeats: int):
    """One camera showing each frame ``repeats`` times in a row (a robot holding still, then
    moving on): consecutive actions are equal within a run and differ across runs."""
    picks = [i for i in range(len(frames) // repeats) for _ in range(repeats)]
    stream = [dataclasses.replace(frames[i], stream_id='cam') for i in picks]
    return stream, [reference[i] for i in picks]


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_previous_action_draft_gives_ar_tokens_and_accepts_repeated_actions(
        policy, frames_and_reference, mode):
    """S3 with temporal drafting and speculative prefill: the AR tokens for every frame, in
    stream order, no draft forward, and a frame whose whole action the stream already decided
    is decided by the one forward that prefills it (the chain rides the prefill): every
    repeat after a run's first frame in spec; in pipeline_spec frame j of a run may be
    admitted while frame j - 1 is still deciding (its chain then stops where the stream's
    knowledge stops), and the run settles at one forward per frame."""
    frames, reference = frames_and_reference
    repeats = 8
    stream, expected = temporal_stream(frames, reference, repeats)
    engine = make_engine(policy, None, mode=mode, draft_path='previous_action')
    draft = engine.strategy.drafter
    out = run_stream(engine, stream)
    assert tokens_by_request(out) == expected
    assert draft.num_forward_passes == 0 and engine.strategy.stats.draft_forward_s == 0.0
    by_id = sorted(out, key=lambda f: f.request_id)
    runs = [[f.result.stats['forward_passes'] for f in by_id[i:i + repeats]]
            for i in range(0, len(by_id), repeats)]
    action_dim = policy.model_config.action_dim
    for passes in runs:
        if mode == 'spec':
            assert passes[1:] == [1] * (repeats - 1), passes
        else:
            assert all(p <= max(2, action_dim - j) for j, p in enumerate(passes)), passes
            assert passes[-2:] == [1, 1], passes
    accepted = [f.result.stats['prefill_accepted'] for f in by_id]
    assert accepted[0] == 0 and max(accepted) == action_dim - 1
    assert draft.previous_action('cam') == tuple(expected[-1])


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_previous_action_draft_without_speculative_prefill_verifies_after_the_prefill(
        policy, frames_and_reference, mode):
    """With ``speculative_prefill: false`` the prefill decides one token and the chain is
    verified in the next step: a repeated frame takes the prefill plus one verification (the
    chain's depth is derived: the rest of the action in one tree)."""
    frames, reference = frames_and_reference
    repeats = 8
    stream, expected = temporal_stream(frames, reference, repeats)
    action_dim = policy.model_config.action_dim
    engine = make_engine(policy, None, mode=mode, draft_path='previous_action',
                         speculative_prefill=False, tree_depth=1)
    out = run_stream(engine, stream)
    assert tokens_by_request(out) == expected
    by_id = sorted(out, key=lambda f: f.request_id)
    assert all(f.result.stats['prefill_accepted'] == 0 for f in by_id)
    runs = [[f.result.stats['forward_passes'] for f in by_id[i:i + repeats]]
            for i in range(0, len(by_id), repeats)]
    for passes in runs:
        if mode == 'spec':
            assert passes[1:] == [2] * (repeats - 1), passes
        else:
            assert all(p <= max(2, action_dim - j) for j, p in enumerate(passes)), passes
            assert passes[-2:] == [2, 2], passes


def test_resetting_a_stream_forgets_its_previous_action(policy, frames_and_reference):
    frames, reference = frames_and_reference
    stream, _ = temporal_stream(frames, reference, repeats=2)
    engine = make_engine(policy, None, mode='spec', draft_path='previous_action')
    run_stream(engine, stream[:2])
    assert engine.strategy.drafter.previous_action('cam') is not None
    engine.reset('cam')
    assert engine.strategy.drafter.previous_action('cam') is None


def record_chains(draft) -> list:
    """(request id, tokens decided before, drafted tokens) of every chain ``draft`` proposes
    from now on."""
    chains, propose = [], draft.propose_batch

    def recording(request_ids, *args, **kwargs):
        decided = [draft.num_decided(rid) for rid in request_ids]
        trees = propose(request_ids, *args, **kwargs)
        chains.extend((rid, d, t.tokens[1:]) for rid, d, t in zip(request_ids, decided, trees))
        return trees
    draft.propose_batch = recording
    return chains


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_previous_action_drafts_follow_each_stream(policy, frames_and_reference, mode):
    """Two cameras, interleaved, each repeating its own scenes: every drafted token is one that
    another frame of the same stream decided at that action position, and each scene's last
    repeat is decided by its prefill alone (speculative prefill)."""
    frames, reference = frames_and_reference
    picks = [(i // 8 * 2 + i % 2) for i in range(32)]         # cam0: 0,0,2,2.. cam1: 1,1,3..
    stream = [dataclasses.replace(frames[k], stream_id=f'cam{k % 2}') for k in picks]
    expected = [reference[k] for k in picks]
    engine = make_engine(policy, None, mode=mode, draft_path='previous_action', tree_depth=5)
    chains = record_chains(engine.strategy.drafter)
    out = run_stream(engine, stream)
    assert tokens_by_request(out) == expected
    decided_by = {fin.request_id: (fin.frame.stream_id, fin.result.tokens) for fin in out}
    assert any(drafted for _, _, drafted in chains)
    for rid, decided, drafted in chains:
        own_stream, tokens = decided_by[rid]
        others = [t for r, (s, t) in decided_by.items() if s == own_stream and r != rid]
        for position, token in enumerate(drafted, start=decided):
            assert any(t[position] == token for t in others), (rid, position)
    passes = {}
    for fin in out:
        passes.setdefault(fin.frame.stream_id, []).append(fin.result.stats['forward_passes'])
    assert set(passes) == {'cam0', 'cam1'}
    for counts in passes.values():          # per stream, runs of 4 repeats of one scene
        assert counts[3::4] == [1] * (len(counts) // 4), counts


def test_resetting_every_stream_or_a_failed_step_forgets_every_previous_action(
        policy, frames_and_reference):
    frames, reference = frames_and_reference
    stream = [dataclasses.replace(frames[i], stream_id=f'cam{i % 2}') for i in range(4)]
    engine = make_engine(policy, None, mode='pipeline_spec', draft_path='previous_action')
    draft = engine.strategy.drafter
    run_stream(engine, stream)
    assert draft.previous_action('cam0') and draft.previous_action('cam1')
    engine.reset()
    assert draft.previous_action('cam0') is None and draft.previous_action('cam1') is None
    run_stream(engine, stream)
    engine.strategy.abort_all()             # what the engine does after a failed step
    assert draft.previous_action('cam0') is None and draft.previous_action('cam1') is None


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_previous_action_merged_into_draft_head_trees(policy, frames_and_reference, mode):
    """``draft_previous_action``: the (random) draft head's trees with the previous action
    merged in give the AR tokens, never exceed tree_max_nodes, and on repeated scenes take
    fewer verifier forwards than the head alone (which drafts badly on purpose)."""
    frames, reference = frames_and_reference
    stream, expected = temporal_stream(frames, reference, repeats=4)
    options = dict(mode=mode, tree_depth=5, tree_top_k=2, tree_max_nodes=10)
    forwards = {}
    for merged in (False, True):
        cfg = EngineConfig(dtype='float64', draft_path='random', draft_previous_action=merged,
                           **options)
        draft = load_draft_for(policy.engine.runner, cfg, None)
        assert type(draft).__name__ == ('WithPreviousAction' if merged else 'EagleDrafter')
        trees = record_trees(draft)
        engine = make_engine(policy, draft, draft_previous_action=merged, **options)
        out = run_stream(engine, stream)
        assert tokens_by_request(out) == expected
        assert max(t.num_nodes for t in trees) <= options['tree_max_nodes']
        forwards[merged] = sum(fin.result.stats['forward_passes'] for fin in out)
        assert draft.num_forward_passes > 0         # the head drafts in both
    assert forwards[True] < forwards[False]


def test_draft_previous_action_with_draft_path_previous_action_is_refused():
    with pytest.raises(ValueError, match='draft_previous_action'):
        EngineConfig(mode='spec', draft_path='previous_action', draft_previous_action=True)


def test_relaxing_against_the_previous_action_is_bounded(policy):
    """Relaxed acceptance against the previous action holds the robot's previous bins while
    the policy's stay within r: above MAX_RELAX_WITH_PREVIOUS_ACTION bins it is refused, at
    load and as a run-time change, with the reason; other drafters and modes keep any r."""
    from vla_spec_ros.config import MAX_RELAX_WITH_PREVIOUS_ACTION as limit
    for drafting in (dict(draft_path='previous_action'),
                     dict(draft_path='random', draft_previous_action=True)):
        EngineConfig(mode='pipeline_spec', relax_threshold=limit, **drafting)
        with pytest.raises(ValueError, match='relax_threshold.*hold its previous'):
            EngineConfig(mode='pipeline_spec', relax_threshold=limit + 1, **drafting)
    EngineConfig(mode='spec', draft_path='random', relax_threshold=255)
    EngineConfig(mode='pipeline', draft_path='previous_action', relax_threshold=255)
    engine = make_engine(policy, None, mode='spec', draft_path='previous_action')
    with pytest.raises(ValueError, match='relax_threshold'):
        engine.set_tunables(relax_threshold=32)
    assert engine.config.relax_threshold == 0
    engine.set_tunables(relax_threshold=limit)
    assert engine.config.relax_threshold == limit
