"""Drafters: the EAGLE tree against a brute-force recomputation, stable-KV consistency across
rounds, and the oracle.

Brute force: every tree candidate's draft output is recomputed by a plain sequential draft
forward along its root path (one token per forward, slot == position, causal masks only), so
the drafter's tree mask, positions and scratch slots are checked independently.
"""
import numpy as np
import pytest
import torch

from vla_spec_ros import VLAPolicy
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import causal_batch, decode_ar
from vla_spec_ros.engine.drafting import eagle_drafter
from vla_spec_ros.engine.drafting.eagle_drafter import EagleDrafter
from vla_spec_ros.engine.drafting.tree_growth import TreeGrowth
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.draft import new_draft_head
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.testing import OracleDrafter

from draft_tree_reference import build_dynamic_tree
from helpers import advance_one, begin_one, propose_one, sharpen_draft_head


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('ckpt') / 'tiny', seed=0)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


@pytest.fixture(scope='module')
def runner(policy):
    return policy.engine.runner


@pytest.fixture(scope='module')
def head(runner):
    return new_draft_head(runner.model, seed=5)


@pytest.fixture(scope='module')
def context(runner):
    """A real prompt: prefix embeddings, AR tokens and the verifier features along them."""
    image = np.random.default_rng(1).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    prompt = runner.prepare_prompt(Frame(image, 'open the top drawer'),
                                   EngineConfig(dtype='float64'))
    embeds = prompt.embeds
    tokens, _ = decode_ar(runner, embeds, runner.max_action_tokens)
    # One causal forward over prefix + a1..a6: rows are f_0..f_{L+5}.
    full = torch.cat([embeds, runner.embed_tokens(torch.tensor(tokens[:-1]))])
    features = runner.forward(full, causal_batch(0, full.shape[0], runner.device),
                              runner.new_cache(full.shape[0]))
    return embeds, features, tokens


@torch.no_grad()
def sequential_outputs(head, embeds, features, root, path_tokens):
    """Draft outputs at the root and along ``path_tokens`` (tokens below the root)."""
    length = embeds.shape[0]
    cache = head.new_kv_cache(length + len(path_tokens) + 1)
    root_embed = head.embed(torch.tensor([root]))
    h = head(torch.cat([embeds[1:], root_embed]), features, causal_batch(0, length, 'cpu'),
             cache)[-1:]
    outputs = [h[0]]
    for j, token in enumerate(path_tokens, start=1):
        h = head(head.embed(torch.tensor([token])), h, causal_batch(length - 1 + j, 1, 'cpu'),
                 cache)
        outputs.append(h[0])
    return outputs


@torch.no_grad()
def brute_force_tree(head, embeds, features, root, depth, top_k, max_nodes, min_prob=0.0,
                     calls=None):
    def expand(partial, frontier):
        if calls is not None:
            calls.append(list(frontier))
        rows = []
        for node in frontier:
            path = [partial.tokens[n] for n in partial.path_to(node)[1:]]
            h = sequential_outputs(head, embeds, features, root, path)[-1]
            logp = torch.log_softmax(head.logits(h), -1)
            values, ids = logp.topk(top_k)
            rows.append([(int(i), min(float(v), 0.0)) for i, v in zip(ids, values)])
        return rows
    return build_dynamic_tree(root, expand, depth, top_k, max_nodes, min_prob)


def assert_same_tree(a, b):
    assert a.tokens == b.tokens
    assert a.parents == b.parents
    assert a.depths == b.depths
    assert a.scores == pytest.approx(b.scores, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize('depth, top_k, max_nodes', [(3, 2, 15), (4, 3, 12), (1, 4, 5),
                                                     (5, 1, 6), (2, 8, 50)])
def test_tree_matches_brute_force(runner, head, context, depth, top_k, max_nodes):
    embeds, features, tokens = context
    length = embeds.shape[0]
    drafter = EagleDrafter(runner, head)
    begin_one(drafter, 0, embeds, features[:length], tokens[0])
    tree = propose_one(drafter, 0, depth, top_k, max_nodes)
    expected = brute_force_tree(head, embeds, features[:length], tokens[0], depth, top_k,
                                max_nodes)
    assert_same_tree(tree, expected)
    assert tree.num_nodes == min(max_nodes, 1 + top_k + (depth - 1) * top_k * top_k)
    # One draft forward for the prefix, then one per expanded level after the first.
    assert drafter.num_forward_passes == 1 + (depth - 1)
    assert_same_tree(propose_one(drafter, 0, depth, top_k, max_nodes), tree)   # scratch is scratch


@pytest.fixture(scope='module')
def confident_head(runner):
    """A random head with peaked distributions (``helpers.sharpen_draft_head``)."""
    return sharpen_draft_head(new_draft_head(runner.model, seed=5))


@pytest.mark.parametrize('min_prob, levels_run', [(0.02, 5), (0.2, 5), (0.6, 4)])
def test_pruned_tree_matches_brute_force_with_fewer_forwards(runner, confident_head, context,
                                                             min_prob, levels_run):
    """Confidence pruning in the batched drafter = the reference builder with the same
    ``min_prob`` over sequential draft forwards; levels with no confident frontier node are
    not run."""
    embeds, features, tokens = context
    length = embeds.shape[0]
    depth, top_k, max_nodes = 5, 3, 30
    head = confident_head
    full = EagleDrafter(runner, head)
    begin_one(full, 0, embeds, features[:length], tokens[0])
    unpruned = propose_one(full, 0, depth, top_k, max_nodes)
    drafter = EagleDrafter(runner, head)
    begin_one(drafter, 0, embeds, features[:length], tokens[0])
    calls = []
    expected = brute_force_tree(head, embeds, features[:length], tokens[0], depth, top_k,
                                max_nodes, min_prob, calls)
    tree = propose_one(drafter, 0, depth, top_k, max_nodes, min_prob)
    assert_same_tree(tree, expected)
    assert all(np.exp(score) >= min_prob for score in tree.scores)
    assert 1 < tree.num_nodes < unpruned.num_nodes
    # the prefix forward, then one per level the reference expanded after the first
    assert len(calls) == levels_run and drafter.num_forward_passes == 1 + len(calls) - 1


def test_advance_equals_fresh_begin(runner, head, context):
    """Stable KV survives tree scratch: advancing equals beginning on the longer context."""
    embeds, features, tokens = context
    length = embeds.shape[0]
    shape = (3, 3, 10)
    incremental = EagleDrafter(runner, head)
    begin_one(incremental, 7, embeds, features[:length], tokens[0])
    propose_one(incremental, 7, *shape)
    decided = 1
    for accepted in (2, 0, 1):
        path = tokens[decided - 1:decided + accepted]           # root + accepted drafts
        bonus = tokens[decided + accepted]
        path_features = features[length + decided - 1:length + decided + accepted]
        advance_one(incremental, 7, path, path_features, bonus)
        decided += accepted + 1
        tree = propose_one(incremental, 7, *shape)

        fresh = EagleDrafter(runner, head)
        longer = torch.cat([embeds, runner.embed_tokens(torch.tensor(tokens[:decided - 1]))])
        begin_one(fresh, 0, longer, features[:length + decided - 1], tokens[decided - 1])
        assert_same_tree(tree, propose_one(fresh, 0, *shape))
        assert_same_tree(tree, brute_force_tree(head, longer, features[:length + decided - 1],
                                                tokens[decided - 1], *shape))


@pytest.mark.parametrize('pad_shapes', [False, True])
def test_batched_drafting_equals_one_request_at_a_time(runner, head, context, pad_shapes):
    """Several requests at different stages share one forward per tree level (and one update
    forward for a prefix plus every accepted path), with the trees of one-at-a-time drafting;
    also with every forward padded to its shape bucket (what CUDA graphs replay)."""
    embeds, features, tokens = context
    length = embeds.shape[0]
    shape = (3, 3, 10)
    batched = EagleDrafter(runner, head, num_lanes=3, pad_shapes=pad_shapes)
    singles = [EagleDrafter(runner, head) for _ in range(3)]
    # Request 0 begins on the full prompt; 1 and 2 on shorter prefixes (other instructions).
    prefixes = [length, length - 3, length - 5]
    for rid, (n, single) in enumerate(zip(prefixes, singles)):
        begin_one(single, rid, embeds[:n], features[:n], tokens[rid])
        begin_one(batched, rid, embeds[:n], features[:n], tokens[rid])
    depths = [3, 2, 1]
    before = batched.num_forward_passes
    trees = batched.propose_batch([0, 1, 2], depths, 3, 10)
    assert batched.num_forward_passes - before == max(depths) - 1
    for rid, (tree, single) in enumerate(zip(trees, singles)):
        assert_same_tree(tree, propose_one(single, rid, depths[rid], 3, 10))
    # One update forward: request 0 accepts two drafts, request 2 none; a new prefix begins.
    from vla_spec_ros.engine.drafting.drafter import DraftAdvance, DraftBegin
    source = torch.cat([features[:length], features[length:length + 3]])
    before = batched.num_forward_passes
    batched.release(1)
    batched.update([DraftBegin(5, embeds, range(length), tokens[0])],
                   [DraftAdvance(0, tokens[:3], [length, length + 1, length + 2], tokens[3]),
                    DraftAdvance(2, tokens[2:3], [length], tokens[3])], source)
    assert batched.num_forward_passes - before == 1
    advance_one(singles[0], 0, tokens[:3], features[length:length + 3], tokens[3])
    advance_one(singles[2], 2, tokens[2:3], features[length:length + 1], tokens[3])
    fresh = EagleDrafter(runner, head)
    begin_one(fresh, 5, embeds, features[:length], tokens[0])
    got = batched.propose_batch([0, 2, 5], [3, 3, 3], *shape[1:])
    assert_same_tree(got[0], propose_one(singles[0], 0, *shape))
    assert_same_tree(got[1], propose_one(singles[2], 2, *shape))
    assert_same_tree(got[2], propose_one(fresh, 5, *shape))


def prompt_context(runner, seed, instruction):
    """(prefix embeddings, verifier features along prefix + AR tokens, AR tokens)."""
    image = np.random.default_rng(seed).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    embeds = runner.prepare_prompt(Frame(image, instruction), EngineConfig(dtype='float64')).embeds
    tokens, _ = decode_ar(runner, embeds, runner.max_action_tokens)
    full = torch.cat([embeds, runner.embed_tokens(torch.tensor(tokens[:-1]))])
    features = runner.forward(full, causal_batch(0, full.shape[0], runner.device),
                              runner.new_cache(full.shape[0]))
    return embeds, features, tokens


@pytest.mark.parametrize('pad_shapes', [False, True])
def test_update_begins_several_prompts_in_one_forward(runner, confident_head, pad_shapes):
    """Three prompts of different lengths begin in one update, their verifier features at
    padded block offsets (garbage in the padding), together with an accepted path of a
    request in flight: one forward, and every request's next trees are those of drafters
    that began it alone (also with padded shapes). A failing update (lanes exhausted, or one
    request twice) changes no lane and no draft state."""
    from vla_spec_ros.engine.drafting.drafter import DraftAdvance, DraftBegin
    contexts = [prompt_context(runner, seed, text) for seed, text in
                ((1, 'open the top drawer'), (2, 'push the blue block to the left of the table'),
                 (3, 'close it'))]
    assert len({c[0].shape[0] for c in contexts}) == 3
    hidden = contexts[0][1].shape[1]
    gen = torch.Generator().manual_seed(0)
    blocks, starts, block_rows = [], [], 64
    for embeds, features, _ in contexts:
        starts.append(sum(b.shape[0] for b in blocks))
        n = embeds.shape[0]
        blocks.append(torch.cat([features[:n], 100 * torch.randn(
            block_rows - n, hidden, generator=gen, dtype=features.dtype)]))
    # Request 9, in flight on the third prompt, accepts a path of three in the same update.
    embeds9, features9, tokens9 = contexts[2]
    n9 = embeds9.shape[0]
    path_rows = sum(b.shape[0] for b in blocks)
    features = torch.cat(blocks + [features9[n9:n9 + 3]])
    batched = EagleDrafter(runner, confident_head, num_lanes=4, pad_shapes=pad_shapes)
    begin_one(batched, 9, embeds9, features9[:n9], tokens9[0])
    before = batched.num_forward_passes
    batched.update([DraftBegin(rid, embeds, range(start, start + embeds.shape[0]), tokens[0])
                    for rid, (embeds, _, tokens), start in zip((0, 1, 2), contexts, starts)],
                   [DraftAdvance(9, tokens9[:3], range(path_rows, path_rows + 3), tokens9[3])],
                   features)
    assert batched.num_forward_passes - before == 1
    singles = {}
    for rid, (embeds, feats, tokens) in zip((0, 1, 2), contexts):
        singles[rid] = EagleDrafter(runner, confident_head)
        begin_one(singles[rid], rid, embeds, feats[:embeds.shape[0]], tokens[0])
    singles[9] = EagleDrafter(runner, confident_head)
    begin_one(singles[9], 9, embeds9, features9[:n9], tokens9[0])
    advance_one(singles[9], 9, tokens9[:3], features9[n9:n9 + 3], tokens9[3])
    trees = batched.propose_batch([0, 1, 2, 9], [3, 3, 3, 3], 3, 10)
    for rid, tree in zip((0, 1, 2, 9), trees):
        assert_same_tree(tree, propose_one(singles[rid], rid, 3, 3, 10))
    # Failing updates keep the lanes and states as they were.
    free, states = list(batched._free_lanes), dict(batched._states)
    embeds0 = contexts[0][0]
    with pytest.raises(RuntimeError, match='draft lanes'):
        batched.update([DraftBegin(20, embeds0, range(embeds0.shape[0]), 1),
                        DraftBegin(21, embeds0, range(embeds0.shape[0]), 1)], [], features)
    with pytest.raises(ValueError, match='already has a draft state'):
        batched.update([DraftBegin(2, embeds0, range(embeds0.shape[0]), 1)], [], features)
    assert batched._free_lanes == free and batched._states == states


def _random_levels(rng, depth, top_k, width, vocab, kind):
    """Proposals for every level of a tree: (frontier rows, width) float32 log-probabilities,
    best first, and token ids. ``kind``: 'random', 'ties' (few distinct values, many equal
    cumulative scores) or 'inf' (some -inf)."""
    levels = []
    for level in range(depth):
        rows = 1 if level == 0 else top_k
        if kind == 'ties':
            values = -rng.integers(0, 3, (rows, width)).astype(np.float32) * 0.5
        else:
            values = -rng.exponential(2.0, (rows, width)).astype(np.float32)
            if kind == 'inf':
                values[rng.random((rows, width)) < 0.3] = -np.inf
        values = -np.sort(-values, axis=1)
        values[rng.random(rows) < 0.2, 0] = 0.0         # a certain draft now and then
        levels.append((values, rng.integers(0, vocab, (rows, width))))
    return levels


@pytest.mark.parametrize('min_prob', [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize('kind', ['random', 'ties', 'inf'])
def test_tree_growth_equals_the_reference_builder(kind, min_prob):
    """The drafter's array form of the tree growth (engine/drafting/tree_growth.py) builds
    exactly the tree of the plain reference (draft_tree_reference.build_dynamic_tree): same
    nodes, same scores, and with confidence pruning the same levels grown (frontiers of the same
    sizes)."""
    rng = np.random.default_rng(0)
    for depth, top_k, max_nodes in [(1, 1, 2), (1, 4, 3), (2, 3, 7), (3, 2, 15), (4, 8, 50),
                                    (4, 8, 400), (5, 1, 6), (3, 5, 12)]:
        for _ in range(5):
            levels = _random_levels(rng, depth, top_k, max(top_k, 6), 40, kind)
            calls = iter(levels)
            frontier_sizes = []

            def expand(partial, frontier):
                values, tokens = next(calls)
                frontier_sizes.append(len(frontier))    # pruning may shorten a frontier
                return [list(zip(t.tolist(), v.tolist()))
                        for t, v in zip(tokens[:len(frontier)], values[:len(frontier)])]
            expected = build_dynamic_tree(3, expand, depth, top_k, max_nodes, min_prob)
            growth = TreeGrowth(3, depth, top_k, min_prob)
            for (values, tokens), size in zip(levels, frontier_sizes):
                assert not growth.is_done and growth.frontier.size == size
                growth.expand(values[:size], tokens[:size])
            assert growth.is_done
            got = growth.tree(max_nodes)
            assert (got.tokens, got.parents, got.depths) == \
                (expected.tokens, expected.parents, expected.depths)
            assert got.scores == expected.scores                # bit for bit


def test_tree_growth_contract_errors():
    good = np.array([[-0.1, -0.2]], dtype=np.float32), np.array([[1, 2]])
    for values in ([[-0.5, -0.1]], [[0.5, -0.1]], [[float('nan'), -0.1]], [[-0.1]],
                   [[-0.1, -0.2], [-0.1, -0.2]]):
        values = np.array(values, dtype=np.float32)
        with pytest.raises(ValueError, match='expand'):
            TreeGrowth(3, 2, 2).expand(values, np.ones(values.shape, dtype=np.int64))
    growth = TreeGrowth(3, 1, 2)
    with pytest.raises(RuntimeError, match='levels'):
        growth.tree(4)
    growth.expand(*good)
    with pytest.raises(RuntimeError, match='levels'):
        growth.expand(*good)
    with pytest.raises(ValueError, match='max_nodes'):
        growth.tree(1)
    for kwargs, field in (({'depth': 0}, 'depth'), ({'top_k': 0}, 'top_k')):
        with pytest.raises(ValueError, match=field):
            TreeGrowth(3, **{'depth': 2, 'top_k': 2, **kwargs})


def test_released_caches_are_reused_without_leaking_state(runner, head, context):
    embeds, features, tokens = context
    length = embeds.shape[0]
    drafter = EagleDrafter(runner, head)
    begin_one(drafter, 0, embeds, features[:length], tokens[0])
    first = propose_one(drafter, 0, 3, 3, 12)
    advance_one(drafter, 0, tokens[:2], features[length:length + 2], tokens[2])
    drafter.release(0)
    begin_one(drafter, 1, embeds, features[:length], tokens[0])
    assert_same_tree(propose_one(drafter, 1, 3, 3, 12), first)


def test_errors(runner, head, context):
    embeds, features, tokens = context
    length = embeds.shape[0]
    drafter = EagleDrafter(runner, head)
    with pytest.raises(ValueError, match='request_id'):
        propose_one(drafter, 0, 2, 2, 4)
    with pytest.raises(ValueError, match='prefix_features'):
        begin_one(drafter, 0, embeds, features[:length - 1], tokens[0])
    begin_one(drafter, 0, embeds, features[:length], tokens[0])
    with pytest.raises(ValueError, match='request_id'):
        begin_one(drafter, 0, embeds, features[:length], tokens[0])
    with pytest.raises(ValueError, match='path_tokens'):
        advance_one(drafter, 0, [tokens[0] + 1], features[length:length + 1], tokens[1])
    with pytest.raises(ValueError, match='path_features'):
        advance_one(drafter, 0, tokens[:2], features[length:length + 1], tokens[2])
    with pytest.raises(ValueError, match='depth'):
        propose_one(drafter, 0, 0, 2, 4)
    with pytest.raises(ValueError, match='top_k'):
        propose_one(drafter, 0, 2, 5000, 4)
    with pytest.raises(ValueError, match='max_position_embeddings'):
        propose_one(drafter, 0, 600, 1, 4)
    with pytest.raises(ValueError, match='each request at most once'):
        drafter.propose_batch([0, 0], [2, 2], 2, 4)
    drafter.release(0)
    drafter.release(0)                                      # idempotent
    with pytest.raises(ValueError, match='request_id'):
        propose_one(drafter, 0, 2, 2, 4)


# ---- oracle ---------------------------------------------------------------------------------

REFERENCE = {3: [900, 901, 902, 903, 904, 905, 906], 4: [10, 20, 30, 40, 50, 60, 70]}


def test_oracle_proposes_the_reference_after_the_root():
    oracle = OracleDrafter(REFERENCE.__getitem__, action_dim=7)
    begin_one(oracle, 3, None, None, 900)
    tree = propose_one(oracle, 3, 6, 8, 50)
    assert tree.tokens == (900, 901, 902, 903, 904, 905, 906)
    assert tree.parents == (-1, 0, 1, 2, 3, 4, 5)
    assert propose_one(oracle, 3, 2, 8, 50).tokens == (900, 901, 902)       # depth caps
    assert propose_one(oracle, 3, 6, 8, 3).tokens == (900, 901, 902)        # max_nodes caps
    advance_one(oracle, 3, [900, 901], None, 902)                           # 1 accepted + bonus
    assert oracle.num_decided(3) == 3
    assert propose_one(oracle, 3, 6, 1, 50).tokens == (902, 903, 904, 905, 906)
    advance_one(oracle, 3, [902, 903, 904, 905], None, 906)
    assert propose_one(oracle, 3, 6, 1, 50).tokens == (906,)                # nothing left to draft
    assert oracle.num_forward_passes == 0
    oracle.release(3)
    with pytest.raises(ValueError, match='request_id'):
        propose_one(oracle, 3, 1, 1, 2)


def test_oracle_error_rate():
    always = OracleDrafter(REFERENCE.__getitem__, action_dim=7, error_rate=1.0)
    begin_one(always, 4, None, None, 10)
    wrong = propose_one(always, 4, 6, 1, 50).tokens[1:]
    assert all(w != r for w, r in zip(wrong, REFERENCE[4][1:]))
    pool = list(range(768, 1024))
    pooled = OracleDrafter(REFERENCE.__getitem__, 7, error_rate=1.0, wrong_tokens=pool)
    begin_one(pooled, 4, None, None, 10)
    assert all(t in pool for t in propose_one(pooled, 4, 6, 1, 50).tokens[1:])
    # Many requests: the fraction of corrupted positions follows error_rate.
    reference = {i: list(range(100, 107)) for i in range(300)}
    half = OracleDrafter(reference.__getitem__, 7, error_rate=0.3, seed=1)
    num_wrong = 0
    for i in range(300):
        begin_one(half, i, None, None, 100)
        num_wrong += sum(t != r for t, r in zip(propose_one(half, i, 6, 1, 50).tokens[1:],
                                                range(101, 107)))
    assert 0.25 < num_wrong / 1800 < 0.35
    # The coin depends on (seed, request, position) only, not on the order of calls.
    again = OracleDrafter(reference.__getitem__, 7, error_rate=0.3, seed=1)
    begin_one(again, 299, None, None, 100)
    assert propose_one(again, 299, 6, 1, 50).tokens == propose_one(half, 299, 6, 1, 50).tokens
    with pytest.raises(ValueError, match='error_rate'):
        OracleDrafter(reference.__getitem__, 7, error_rate=1.5)


@pytest.mark.parametrize('min_prob', [0.02, 0.2, 0.6, 0.9])
def test_batched_pruned_drafting_equals_the_reference(runner, confident_head, context,
                                                      min_prob):
    """Pruning in one batch: requests whose frontiers shrink or empty at different levels
    (padded rows in the shared level forwards) get the trees of the reference builder over
    sequential draft forwards, each on its own prefix."""
    embeds, features, tokens = context
    length = embeds.shape[0]
    head = confident_head
    batched = EagleDrafter(runner, head, num_lanes=4)
    prefixes = [length, length - 2, length - 4, length - 6]
    depths = [5, 4, 5, 2]
    for rid, n in enumerate(prefixes):
        begin_one(batched, rid, embeds[:n], features[:n], tokens[rid])
    calls = []
    trees = batched.propose_batch(list(range(4)), depths, 3, 20, min_prob)
    for rid, (n, depth, tree) in enumerate(zip(prefixes, depths, trees)):
        levels = []
        expected = brute_force_tree(head, embeds[:n], features[:n], tokens[rid], depth, 3, 20,
                                    min_prob, levels)
        assert_same_tree(tree, expected)
        calls.append(len(levels))
    # the shared level forwards run as long as the longest-growing tree
    assert batched.num_forward_passes == 4 + max(calls) - 1


def test_captured_level_shapes_cover_serving(policy, runner, confident_head, monkeypatch):
    """``capture_graphs`` builds (with padded shapes) every tree-level bucket that trees over
    one prompt length meet: serving frames of that prompt through pipeline_spec then finds
    every level forward's bucket already built. Building them touches no request state."""
    from vla_spec_ros.engine.engine import Engine
    options = dict(mode='pipeline_spec', max_inflight=4, tree_depth=3, tree_top_k=3,
                   tree_max_nodes=8, dtype='float64')
    cfg = EngineConfig(**options)
    drafter = EagleDrafter(runner, confident_head, num_lanes=4, pad_shapes=True)
    instruction = 'open the top drawer'
    prefix_len = runner.prefix_len(runner.validate_instruction(instruction))
    built = drafter.capture_graphs(prefix_len, cfg.tree_depth, cfg.tree_top_k)
    assert built == 3           # 1, 2 and 4 requests, one 128-slot bucket for this prompt
    assert drafter.num_forward_passes == 0 and not drafter._states
    level_layout, missing, calls = eagle_drafter.level_layout, [], []

    def checking(*args):
        step, num_rows = level_layout(*args)
        calls.append(step)
        if not drafter.forward.has_bucket(step, {'features': drafter._sources},
                                          {'top_k': cfg.tree_top_k}):
            missing.append(step.key)
        return step, num_rows
    monkeypatch.setattr(eagle_drafter, 'level_layout', checking)
    engine = Engine(runner, policy.engine.norm_stats, cfg, draft=drafter)
    rng = np.random.default_rng(4)
    for i in range(12):
        engine.submit(Frame(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8), instruction,
                            'bridge_orig', f'cam{i % 2}'))
    finished = engine.run_until_idle()
    assert len(finished) == 12 and all(f.error is None for f in finished)
    assert calls and missing == []
