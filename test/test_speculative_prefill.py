"""Speculative prefill: a new frame's prefill block carries its stream's draft (the previous
action) after the prompt, and the one forward that prefills the frame verifies it.

Host layout (numpy) against the plain attention rule; the drafter's chain; and through the
engine in float64, the AR tokens whatever the chain (accepted fully, partly, not at all) in
spec and pipeline_spec, with several streams and several prefills per step, on drifting,
repeating and jumping frames, an instruction change and a reset, and with the padded (CUDA
graph) step shapes run eagerly.
"""
import collections

import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.scheduling.kv_ring import KVRing
from vla_spec_ros.engine.drafting.previous_action_drafter import PreviousActionDrafter
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.engine.device.step_inputs import PrefillRows, pack_step, padding_step, tree_rows
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from helpers import serve_streams
from reference import ar_reference_tokens

ACTION_DIM = 7


# ---- host layout (no torch) ---------------------------------------------------------------

def test_chain_rows_continue_the_prompt_causally_and_are_read_back():
    ring = KVRing(200)
    ring.allocate(1, 40)
    ring.allocate(2, 40)
    chain = (31000, 31001, 31002)
    prefills = [PrefillRows(ring.span(1).start, 200, 10, chain),
                PrefillRows(ring.span(2).start, 200, 12)]
    step = pack_step(prefills, [], scratch_slot=200)
    assert step.prefill_blocks == (13, 12)
    # The chain continues the prompt: positions and slots 10, 11, 12 of its request.
    assert step.positions[:13].tolist() == list(range(13))
    assert step.slot_mapping[10:13].tolist() == [ring.span(1).slot(i) for i in (10, 11, 12)]
    # Four reads per prefill: the prompt's last row, then each chain row; the chainless
    # prefill reads its last row, repeated as padding.
    assert step.reads_per_prefill == 4
    assert step.extras['prefill_read'].tolist() == [9, 10, 11, 12, 24, 24, 24, 24]
    # Tight: the chain's token ids and the rows whose input they become, nothing else.
    assert step.extras['prefill_chain_ids'].tolist() == list(chain)
    assert step.extras['prefill_chain_rows'].tolist() == [10, 11, 12]
    assert 'prefill_chain_ids' not in pack_step(prefills[1:], [], scratch_slot=200).extras


def test_fixed_chain_entries_pad_every_block_on_its_padding_rows():
    ring = KVRing(200)
    ring.allocate(1, 40)
    ring.allocate(2, 40)
    prefills = [PrefillRows(ring.span(1).start, 200, 10, (5, 6)),
                PrefillRows(ring.span(2).start, 200, 12)]
    with pytest.raises(ValueError, match='no room'):     # block 2 (12 rows) has no room
        pack_step(prefills, [], scratch_slot=200, chain_per_prefill=3)
    step = pack_step(prefills, [], scratch_slot=200, prefill_rows=16, chain_per_prefill=3)
    assert step.prefill_blocks == (16, 16)
    assert step.extras['prefill_chain_ids'].tolist() == [5, 6, 0, 0, 0, 0]
    assert step.extras['prefill_chain_rows'].tolist() == [10, 11, 12, 28, 29, 30]
    assert step.extras['prefill_read'].tolist() == [9, 10, 11, 11, 27, 27, 27, 27]
    # Padding chain rows write the scratch slot only.
    assert step.slot_mapping[[12, 28, 29, 30]].tolist() == [200] * 4


def test_a_chained_prefill_beside_segments_keeps_their_layout():
    ring = KVRing(300)
    for rid in (1, 2):
        ring.allocate(rid, 60)
    segment = tree_rows(ring.span(1).start, 300, 20, [-1, 0, 1], [7, 8, 9])
    plain = pack_step([PrefillRows(ring.span(2).start, 300, 15)], [segment], 300)
    chained = pack_step([PrefillRows(ring.span(2).start, 300, 15, (4, 4))], [segment], 300)
    assert chained.num_prefill == plain.num_prefill + 2
    for name in ('token_ids', 'kv_index', 'mask'):
        assert np.array_equal(getattr(chained, name), getattr(plain, name))
    assert chained.positions[17:].tolist() == plain.positions[15:].tolist()


def test_padding_steps_reserve_chain_rows_in_every_block():
    step = padding_step((64, 64), 1, 4, 128, 0, scratch_slot=500, chain_per_prefill=6)
    assert step.reads_per_prefill == 7
    assert step.extras['prefill_chain_rows'].tolist() == [*range(6), *range(64, 70)]
    assert (step.slot_mapping == 500).all()


# ---- the drafter's chain (no torch) -------------------------------------------------------

def test_prefill_draft_is_the_streams_newest_decided_prefix():
    from vla_spec_ros.engine.drafting.drafter import DraftAdvance, DraftBegin
    draft = PreviousActionDrafter(ACTION_DIM)
    assert draft.has_prefill_draft and draft.derives_depth
    assert draft.prefill_draft('cam', 6) == []
    draft.observe_action('cam', [1, 2, 3, 4, 5, 6, 7], 0)
    assert draft.prefill_draft('cam', 6) == [1, 2, 3, 4, 5, 6]
    assert draft.prefill_draft('cam', 2) == [1, 2]
    assert draft.prefill_draft('other', 6) == []
    # A newer frame in flight that decided three tokens (two of them in its prefill) wins
    # at those positions; the rest still come from the previous action.
    draft.update([DraftBegin(1, None, range(0), 30, 'cam', decided_before_root=(10, 20))], [],
                 None)
    assert draft.num_decided(1) == 3
    assert draft.prefill_draft('cam', 6) == [10, 20, 30, 4, 5, 6]
    draft.update([], [DraftAdvance(1, [30, 40], range(2), 50)], None)
    assert draft.prefill_draft('cam', 6) == [10, 20, 30, 40, 50, 6]
    draft.forget_stream('cam')         # a reset: the engine drops the stream's frames too
    assert draft.prefill_draft('cam', 6) == []
    with pytest.raises(ValueError, match='decided_before_root'):
        draft.update([DraftBegin(2, None, range(0), 1, 'cam', decided_before_root=(1,) * 7)],
                     [], None)


# ---- through the engine (float64) --------------------------------------------------------

@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('spec_prefill') / 'tiny', seed=3)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


def drifting_stream(stream_id: str, seed: int, instruction: str, num: int):
    """A camera whose frames drift (small noise on one scene), hold still (a repeated frame),
    jump (a new scene) and change instruction: every case a chain can meet."""
    rng = np.random.default_rng(seed)
    scene = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    frames = []
    for i in range(num):
        if i % 6 == 4:                              # a jump: another scene
            scene = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        elif i % 6 != 2:                            # drift (i % 6 == 2 repeats the frame)
            scene = np.clip(scene.astype(int) + rng.integers(-3, 4, scene.shape), 0,
                            255).astype(np.uint8)
        text = instruction if i < num // 2 else 'now open the drawer'
        frames.append(Frame(scene.copy(), text, 'bridge_orig', stream_id))
    return frames


def interleave(*streams):
    return [f for group in zip(*streams) for f in group]


def run_saturating(engine, frames):
    """Offer a frame whenever none of its stream waits; results in emit order."""
    out = serve_streams(engine, frames)
    return out


def by_request(out):
    streams = collections.defaultdict(list)
    for fin in out:
        streams[fin.frame.stream_id].append(fin.request_id)
    assert all(ids == sorted(ids) for ids in streams.values())       # per-stream order
    return sorted(out, key=lambda f: f.request_id)


def make_engine(policy, drafter=None, **options):
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    cfg = EngineConfig(dtype='float64', **options)
    runner = policy.engine.runner
    if drafter is None:
        drafter = load_draft_for(runner, cfg, None)
    return Engine(runner, policy.engine.norm_stats, cfg, draft=drafter)


class ScriptedChains(PreviousActionDrafter):
    """The previous-action drafter, except that each new frame's prefill chain is scripted:
    per stream, in admission order, the frame's own AR tokens cut or corrupted at a set
    position (so the chain is accepted fully, partly or not at all by construction)."""

    def __init__(self, scripts: dict):
        super().__init__(ACTION_DIM)
        self.scripts = {s: collections.deque(v) for s, v in scripts.items()}

    def prefill_draft(self, stream_id, max_len, step=None):
        tokens, wrong_at = self.scripts[stream_id].popleft()
        chain = list(tokens[:max_len])
        if wrong_at is not None:
            chain[wrong_at] = chain[wrong_at] - 1 if chain[wrong_at] > 0 else 1
        return chain


@pytest.mark.parametrize('mode,max_prefills', [('spec', 1), ('pipeline_spec', 1),
                                               ('pipeline_spec', 2)])
def test_a_chain_accepted_fully_partly_or_not_at_all_gives_the_ar_tokens(
        policy, mode, max_prefills):
    streams = [drifting_stream(f'cam{s}', seed=s, instruction='pick up the cup', num=8)
               for s in range(2)]
    frames = interleave(*streams)
    reference = ar_reference_tokens(policy, frames)
    wrong_at = [None, 0, 3, 5, None, 2, 1, None]        # per frame of a stream
    scripts = {f'cam{s}': [(reference[2 * i + s], wrong_at[i]) for i in range(8)]
               for s in range(2)}
    engine = make_engine(policy, ScriptedChains(scripts), mode=mode,
                         max_prefills_per_step=max_prefills)
    out = by_request(run_saturating(engine, frames))
    assert [f.result.tokens for f in out] == reference
    for fin in out:
        wrong = wrong_at[fin.request_id // 2]
        accepted = ACTION_DIM - 1 if wrong is None else wrong
        assert fin.result.stats['prefill_accepted'] == accepted
        assert fin.result.stats['accepted_lengths'][0] == accepted + 1
        if wrong is None:                   # the whole action in the prefill's forward
            assert fin.result.stats['forward_passes'] == 1
    if max_prefills > 1:
        assert engine.strategy.stats.num_advanced > engine.strategy.stats.num_steps


@pytest.mark.parametrize('mode,max_prefills', [('spec', 1), ('pipeline_spec', 1),
                                               ('pipeline_spec', 2)])
def test_previous_action_on_drifting_streams_with_a_reset_gives_the_ar_tokens(
        policy, mode, max_prefills):
    """Two cameras (drift, repeat, jump, instruction change), the real previous-action
    drafter, then a reset of one stream part-way: the AR tokens, and the chain after the
    reset starts empty."""
    streams = [drifting_stream(f'cam{s}', seed=10 + s, instruction='push the block', num=12)
               for s in range(2)]
    frames = interleave(*streams)
    reference = ar_reference_tokens(policy, frames)
    engine = make_engine(policy, mode=mode, draft_path='previous_action',
                         max_prefills_per_step=max_prefills)
    first = by_request(run_saturating(engine, frames[:12]))
    engine.reset('cam0')
    assert engine.strategy.drafter.prefill_draft('cam0', 6) == []
    second = by_request(run_saturating(engine, frames[12:]))
    assert [f.result.tokens for f in first + second] == reference
    after_reset = [f for f in second if f.frame.stream_id == 'cam0']
    assert after_reset[0].result.stats['prefill_accepted'] == 0
    accepted = [f.result.stats['prefill_accepted'] for f in first + second]
    assert max(accepted) == ACTION_DIM - 1
    if mode == 'spec':              # a repeated frame (every 6th from the 3rd): one forward
        repeats = [f for f in first + second if (f.request_id // 2) % 6 == 2]
        assert repeats and all(f.result.stats['forward_passes'] == 1 for f in repeats)


def test_relaxed_acceptance_in_the_prefill_keeps_the_drafted_bins(tmp_path_factory):
    """r > 0: a chain of action tokens one bin off the AR tokens is accepted whole in the
    prefill at r = 255 (every action bin is close; later tokens are conditioned on the kept
    ones, so a smaller r has no fixed reference) and kept as drafted; r = 0 rejects it and
    gives the AR tokens."""
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('relaxed') / 'tiny', seed=5)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64',
                                       restrict_to_action_tokens=True)
    frames = drifting_stream('cam', seed=4, instruction='open the drawer', num=4)
    reference = ar_reference_tokens(policy, frames)
    at = policy.engine.runner.codec

    def one_bin_off(token):             # neighbouring action tokens are neighbouring bins
        return token + 1 if token < at.last_action_id else token - 1
    off = [tuple(one_bin_off(t) for t in ref) for ref in reference]

    class OffByOne(ScriptedChains):
        def prefill_draft(self, stream_id, max_len, step=None):
            return list(self.scripts[stream_id].popleft()[:max_len])

    for r in (0, 255):
        # draft_path 'random': this double drafts the AR tokens' neighbours, not the previous
        # action, so the bound on r for previous-action drafting does not concern it.
        engine = make_engine(policy, OffByOne({'cam': off}), mode='spec', relax_threshold=r,
                             restrict_to_action_tokens=True, draft_path='random')
        out = by_request(run_saturating(engine, frames))
        for fin, ref, drafted in zip(out, reference, off):
            if r == 0:
                assert fin.result.tokens == ref
                assert fin.result.stats['prefill_accepted'] == 0
            else:
                assert fin.result.tokens[:ACTION_DIM - 1] == drafted[:ACTION_DIM - 1]
                assert fin.result.stats['forward_passes'] == 1


def test_padded_graph_shapes_give_the_same_tokens(policy, monkeypatch):
    """The CUDA-graph step shapes (every block padded to 64-row buckets with room for a full
    chain, a fixed number of reads and chain rows per prefill, padded segments) run eagerly
    on the CPU: the same tokens as the tight shapes."""
    frames = interleave(*[drifting_stream(f'cam{s}', seed=20 + s, instruction='close it',
                                          num=8) for s in range(2)])
    reference = ar_reference_tokens(policy, frames)
    engine = make_engine(policy, mode='pipeline_spec', draft_path='previous_action',
                         max_prefills_per_step=2)
    strategy = engine.strategy
    shapes = []

    def graph_sized(prefills, segments, num_moves):
        sizes = strategy._graph_sizes([p.prompt_len for p in prefills], len(segments),
                                      max((s.num_rows for s in segments), default=1),
                                      max((s.num_cols for s in segments), default=1),
                                      num_moves)
        shapes.append(sizes)
        return sizes
    monkeypatch.setattr(strategy, '_padded_sizes', graph_sized)
    out = by_request(run_saturating(engine, frames))
    assert [f.result.tokens for f in out] == reference
    assert any(s['prefill_rows'] for s in shapes)
    assert all(s['chain_per_prefill'] == ACTION_DIM - 1 for s in shapes)
    assert max(f.result.stats['prefill_accepted'] for f in out) > 0


def test_speculative_prefill_is_off_without_a_feature_free_draft(policy):
    """A draft head needs the prefill's features before it drafts: no chain rides its
    prefill; with draft_previous_action the chain part does."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    cfg = EngineConfig(dtype='float64', mode='spec', draft_path='random')
    head = load_draft_for(policy.engine.runner, cfg, None)
    assert make_engine(policy, head, mode='spec').strategy.max_prefill_draft == 0
    merged = load_draft_for(policy.engine.runner,
                            cfg.replace(draft_previous_action=True), None)
    engine = make_engine(policy, merged, mode='spec', draft_path='random',
                         draft_previous_action=True)
    assert engine.strategy.max_prefill_draft == ACTION_DIM - 1
    off = make_engine(policy, mode='spec', draft_path='previous_action',
                      speculative_prefill=False)
    assert off.strategy.max_prefill_draft == 0


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_merged_head_trees_continue_after_a_partly_accepted_prefill(policy, mode):
    """draft_previous_action: the chain rides the prefill, the head's draft lane begins from
    the prompt plus the accepted chain tokens, and its trees carry on: the AR tokens."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    frames = interleave(*[drifting_stream(f'cam{s}', seed=30 + s, instruction='pick it up',
                                          num=8) for s in range(2)])
    reference = ar_reference_tokens(policy, frames)
    options = dict(mode=mode, draft_path='random', draft_previous_action=True, tree_depth=3,
                   tree_top_k=2, tree_max_nodes=8)
    drafter = load_draft_for(policy.engine.runner, EngineConfig(dtype='float64', **options),
                             None)
    engine = make_engine(policy, drafter, **options)
    out = by_request(run_saturating(engine, frames))
    assert [f.result.tokens for f in out] == reference
    assert drafter.num_forward_passes > 0
    assert max(f.result.stats['prefill_accepted'] for f in out) > 0
