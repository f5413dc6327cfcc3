"""Unit tests for the EAGLE-2 dynamic draft tree (pure Python, no torch).

The builder is checked against an independent reference that works on token paths instead of
node ids: all token paths up to the tree depth are enumerated, the EAGLE-2 candidate set is
derived from them level by level, and the kept set is the best ``max_nodes - 1`` by score.
"""
import itertools
import math
import random

import pytest

from vla_spec_ros.engine.drafting.draft_tree import DraftTree, chain_tree

from draft_tree_reference import PartialTree, build_dynamic_tree
from helpers import root_to_leaf_paths, tree_mask

ROOT_TOKEN = 7


def random_distribution(path, vocab_size):
    """Draft log-probabilities after ``path`` (a token tuple), a fixed random function of it."""
    rng = random.Random(f'draft:{ROOT_TOKEN}:{path}')
    logits = [rng.gauss(0.0, 2.0) for _ in range(vocab_size)]
    log_norm = math.log(sum(math.exp(x) for x in logits))
    return {token: logit - log_norm for token, logit in enumerate(logits)}


def sorted_proposals(distribution):
    return sorted(distribution.items(), key=lambda item: (-item[1], item[0]))


def token_path(tokens, parents, node):
    """Tokens from the first draft level down to ``node`` (root token excluded)."""
    path = []
    while parents[node] != -1:
        path.append(tokens[node])
        node = parents[node]
    return tuple(reversed(path))


def ancestors_or_self(parents, node):
    result = {node}
    while parents[node] != -1:
        node = parents[node]
        result.add(node)
    return result


def make_expand(vocab_size, calls):
    def expand(partial, frontier):
        calls.append((partial, list(frontier)))
        rows = []
        for node in frontier:
            path = tuple(partial.tokens[i] for i in partial.path_to(node)[1:])
            rows.append(sorted_proposals(random_distribution(path, vocab_size)))
        return rows
    return expand


def reference_candidates(vocab_size, depth, top_k):
    """Every EAGLE-2 candidate as {token path: cumulative score}, by brute-force enumeration."""
    candidates = {}
    frontier = {()}
    for level in range(1, depth + 1):
        level_scores = {}
        for path in itertools.product(range(vocab_size), repeat=level):
            prefix = path[:-1]
            if prefix not in frontier:
                continue
            ranked = sorted_proposals(random_distribution(prefix, vocab_size))
            if path[-1] not in [token for token, _ in ranked[:top_k]]:
                continue
            # Score summed independently along the path, from the root down.
            level_scores[path] = sum(random_distribution(path[:i], vocab_size)[path[i]]
                                     for i in range(level))
        candidates.update(level_scores)
        frontier = set(sorted(level_scores, key=lambda p: -level_scores[p])[:top_k])
    return candidates


@pytest.mark.parametrize('depth', [1, 2, 3, 4, 5])
@pytest.mark.parametrize('top_k', [1, 2, 3, 4, 5, 6, 7, 8])
def test_build_matches_brute_force(depth, top_k):
    vocab_size = top_k + 2
    candidates = reference_candidates(vocab_size, depth, top_k)
    assert len(candidates) == top_k + (depth - 1) * top_k * top_k
    by_score = sorted(candidates, key=lambda p: -candidates[p])
    for max_nodes in sorted({2, 3, 10, 50, len(candidates), len(candidates) + 1, 10_000}):
        if max_nodes < 2:
            continue
        calls = []
        tree = build_dynamic_tree(ROOT_TOKEN, make_expand(vocab_size, calls), depth, top_k,
                                  max_nodes)
        expected = set(by_score[:max_nodes - 1])

        # Contract of the expand callable: depth calls, root first, frontiers of <= top_k
        # nodes of the newest level.
        assert len(calls) == depth
        assert calls[0][1] == [0]
        for level, (partial, frontier) in enumerate(calls[1:], start=1):
            assert isinstance(partial, PartialTree)
            assert 1 <= len(frontier) <= top_k
            assert all(partial.depths[node] == level for node in frontier)

        # The kept set, its scores and its ancestor closure.
        assert tree.num_nodes == min(max_nodes, len(candidates) + 1)
        assert tree.tokens[0] == ROOT_TOKEN and tree.parents[0] == -1
        paths = [token_path(tree.tokens, tree.parents, i) for i in range(1, tree.num_nodes)]
        assert len(set(paths)) == len(paths)
        assert set(paths) == expected
        for i, path in enumerate(paths, start=1):
            assert math.isclose(tree.scores[i], candidates[path], rel_tol=0, abs_tol=1e-12)
            assert tree.depths[i] == len(path)
            assert path[:-1] == () or path[:-1] in expected
            assert tree.parents[i] < i


@pytest.mark.parametrize('depth,top_k,max_nodes', [(1, 1, 2), (3, 2, 7), (4, 3, 20), (5, 8, 60)])
def test_mask_positions_paths_match_independent_computation(depth, top_k, max_nodes):
    tree = build_dynamic_tree(ROOT_TOKEN, make_expand(top_k + 2, []), depth, top_k, max_nodes)
    parents = tree.parents
    mask = tree_mask(tree)
    assert len(mask) == tree.num_nodes
    for i in range(tree.num_nodes):
        allowed = ancestors_or_self(parents, i)
        assert mask[i] == [j in allowed for j in range(tree.num_nodes)]
        assert tree.depths[i] == len(allowed) - 1
        assert tree.children(i) == tuple(j for j in range(tree.num_nodes) if parents[j] == i)

    leaves = [i for i in range(tree.num_nodes) if i not in set(parents)]
    expected_paths = [sorted(ancestors_or_self(parents, leaf)) for leaf in leaves]
    assert root_to_leaf_paths(tree) == expected_paths
    assert tree.max_depth == max(len(p) - 1 for p in expected_paths)


@pytest.mark.parametrize('logprob_of_rank', [lambda r: 0.0, lambda r: -1.0, lambda r: -0.5 * r])
@pytest.mark.parametrize('depth,top_k', [(2, 2), (3, 3), (4, 2), (5, 4)])
def test_ties_keep_ancestors_and_are_deterministic(logprob_of_rank, depth, top_k):
    """Equal scores everywhere (or within levels): the kept set stays ancestor-closed."""
    seen = []

    def expand(partial, frontier):
        seen.append(partial)
        return [[(10 * node + rank, logprob_of_rank(rank)) for rank in range(top_k)]
                for node in frontier]

    total = top_k + (depth - 1) * top_k * top_k
    for max_nodes in range(2, total + 2):
        seen.clear()
        tree = build_dynamic_tree(ROOT_TOKEN, expand, depth, top_k, max_nodes)
        again = build_dynamic_tree(ROOT_TOKEN, expand, depth, top_k, max_nodes)
        assert tree == again
        assert tree.num_nodes == min(max_nodes, total + 1)
        # parents precede children (checked by DraftTree) and scores never rise along a path
        for i in range(1, tree.num_nodes):
            assert tree.scores[i] <= tree.scores[tree.parents[i]]
        # every kept candidate scores at least as well as every dropped one
        partial = seen[0]
        kept = {(tree.depths[i], tree.scores[i], token_path(tree.tokens, tree.parents, i))
                for i in range(1, tree.num_nodes)}
        all_candidates = {(partial.depths[c], partial.scores[c],
                           token_path(partial.tokens, partial.parents, c))
                          for c in range(1, partial.num_candidates)}
        dropped = all_candidates - kept
        if dropped:
            assert min(s for _, s, _ in kept) >= max(s for _, s, _ in dropped)


def test_all_zero_scores_keep_creation_order():
    """With every score 0.0, ties resolve by creation: level 1 first, then frontier order."""
    def expand(partial, frontier):
        return [[(100 * node + rank, 0.0) for rank in range(2)] for node in frontier]

    tree = build_dynamic_tree(ROOT_TOKEN, expand, depth=3, top_k=2, max_nodes=5)
    # Creation: ids 1,2 (root's children, tokens 0,1); frontier [1,2] proposes ids 3..6
    # (tokens 100,101 under node 1 and 200,201 under node 2). Best 4 = ids 1,2,3,4.
    assert tree.tokens == (ROOT_TOKEN, 0, 1, 100, 101)
    assert tree.parents == (-1, 0, 0, 1, 1)
    assert tree.depths == (0, 1, 1, 2, 2)


def test_rerank_can_drop_deep_nodes_for_shallow_ones():
    # Root proposes a (-0.1), b (-3.0); a proposes c (-0.2), d (-5.0); b proposes e, f.
    table = {(): [(1, -0.1), (2, -3.0)], (1,): [(3, -0.2), (4, -5.0)],
             (2,): [(5, -0.1), (6, -0.3)]}

    def expand(partial, frontier):
        return [table[tuple(partial.tokens[i] for i in partial.path_to(n)[1:])]
                for n in frontier]

    tree = build_dynamic_tree(ROOT_TOKEN, expand, depth=2, top_k=2, max_nodes=4)
    # Scores: a -0.1, b -3.0, ac -0.3, ad -5.1, be -3.1, bf -3.3 -> keep a, ac, b.
    assert tree.tokens == (ROOT_TOKEN, 1, 2, 3)
    assert tree.parents == (-1, 0, 0, 1)
    assert [round(s, 9) for s in tree.scores] == [0.0, -0.1, -3.0, -0.3]


def test_expand_contract_violations_raise():
    def returning(rows_for):
        return lambda partial, frontier: rows_for(frontier)

    good = [(1, -0.1), (2, -0.2)]
    cases = [
        returning(lambda f: [good[:1] for _ in f]),                    # fewer than top_k
        returning(lambda f: [[(1, -0.5), (2, -0.1)] for _ in f]),      # not sorted
        returning(lambda f: [[(1, 0.5), (2, -0.1)] for _ in f]),       # positive logprob
        returning(lambda f: [[(1, float('nan')), (2, -0.1)] for _ in f]),
        returning(lambda f: [good for _ in f] + [good]),               # wrong row count
    ]
    for expand in cases:
        with pytest.raises(ValueError, match='expand'):
            build_dynamic_tree(ROOT_TOKEN, expand, depth=2, top_k=2, max_nodes=5)


def test_negative_infinity_logprobs_are_allowed():
    def expand(partial, frontier):
        return [[(1, 0.0), (2, float('-inf'))] for _ in frontier]

    tree = build_dynamic_tree(ROOT_TOKEN, expand, depth=3, top_k=2, max_nodes=100)
    assert tree.num_nodes == 1 + 2 + 4 + 4
    for i in range(1, tree.num_nodes):
        assert tree.scores[i] <= tree.scores[tree.parents[i]]


def kept_by_path(tree):
    """{token path: score} of every non-root node (paths are unique: siblings differ)."""
    return {token_path(tree.tokens, tree.parents, i): tree.scores[i]
            for i in range(1, tree.num_nodes)}


@pytest.mark.parametrize('depth,top_k', [(1, 3), (3, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize('min_prob', [0.001, 0.02, 0.1, 0.3, 0.9])
def test_pruned_tree_is_the_unpruned_candidates_above_the_floor(depth, top_k, min_prob):
    """Pruning never changes what the draft proposes at a confident node (its children depend
    on its path only), and a dropped node's descendants all score below the floor: so the
    pruned tree is the best ``max_nodes - 1`` of the unpruned growth's candidates whose
    cumulative probability reaches ``min_prob``, found here from the unpruned tree alone."""
    full = build_dynamic_tree(ROOT_TOKEN, make_expand(top_k + 3, []), depth, top_k, 10_000)
    confident = sorted(((score, path) for path, score in kept_by_path(full).items()
                        if math.exp(score) >= min_prob), key=lambda item: -item[0])
    for max_nodes in (2, 4, 9, 10_000):
        calls = []
        tree = build_dynamic_tree(ROOT_TOKEN, make_expand(top_k + 3, calls), depth, top_k,
                                  max_nodes, min_prob=min_prob)
        got = kept_by_path(tree)
        assert all(math.exp(score) >= min_prob for score in got.values())
        assert len(got) == min(max_nodes - 1, len(confident))
        # the kept nodes are confident candidates of the unpruned growth, none worse than any
        # confident candidate left out (ties aside: scores are random floats)
        assert all(full_score == got[path] for path, full_score in kept_by_path(full).items()
                   if path in got)
        assert set(got) <= {path for _, path in confident}
        left_out = [score for score, path in confident if path not in got]
        if left_out and got:
            assert min(got.values()) >= max(left_out)
        # growth stops at the first level with no confident candidate to expand
        levels_with_confident = {len(path) for _, path in confident}
        expected_calls = min(depth, 1 + max(levels_with_confident, default=0))
        assert len(calls) == expected_calls
        if min_prob <= 0.001:
            assert tree.num_nodes > 1


def test_min_prob_zero_is_eagle2_and_one_keeps_only_certain_drafts():
    expand = make_expand(6, [])
    assert build_dynamic_tree(ROOT_TOKEN, expand, 3, 2, 12, min_prob=0.0) == \
        build_dynamic_tree(ROOT_TOKEN, expand, 3, 2, 12)
    calls = []
    tree = build_dynamic_tree(ROOT_TOKEN, make_expand(6, calls), 4, 3, 50, min_prob=1.0)
    assert tree.num_nodes == 1 and len(calls) == 1      # root only, one expansion

    def certain_then_unsure(partial, frontier):         # log-probability 0 down one chain
        return [[(1, 0.0), (2, -1.0)] if partial.depths[node] < 2 else [(3, -0.01), (4, -1.0)]
                for node in frontier]

    chain = build_dynamic_tree(ROOT_TOKEN, certain_then_unsure, 4, 2, 50, min_prob=1.0)
    assert chain.tokens == (ROOT_TOKEN, 1, 1) and chain.parents == (-1, 0, 1)


@pytest.mark.parametrize('min_prob', [-0.1, 1.5, float('nan')])
def test_bad_min_prob_raises(min_prob):
    with pytest.raises(ValueError, match='min_prob'):
        build_dynamic_tree(ROOT_TOKEN, make_expand(4, []), 2, 2, 4, min_prob=min_prob)


@pytest.mark.parametrize('kwargs,field', [({'depth': 0}, 'depth'), ({'top_k': 0}, 'top_k'),
                                          ({'max_nodes': 1}, 'max_nodes')])
def test_bad_sizes_raise(kwargs, field):
    args = {'depth': 2, 'top_k': 2, 'max_nodes': 4, **kwargs}
    with pytest.raises(ValueError, match=field):
        build_dynamic_tree(ROOT_TOKEN, make_expand(4, []), **args)


def test_chain_tree():
    tree = chain_tree(5, [8, 9, 10], logprobs=[-0.5, -0.25, 0.0])
    assert tree.tokens == (5, 8, 9, 10)
    assert tree.parents == (-1, 0, 1, 2)
    assert tree.depths == (0, 1, 2, 3)
    assert tree.scores == (0.0, -0.5, -0.75, -0.75)
    assert tree_mask(tree) == [[j <= i for j in range(4)] for i in range(4)]
    assert root_to_leaf_paths(tree) == [[0, 1, 2, 3]]
    assert tree.children(1) == (2,) and tree.children(3) == ()

    default = chain_tree(5, [8, 9])
    assert default.scores == (0.0, 0.0, 0.0)
    root_only = chain_tree(5, [])
    assert root_only.num_nodes == 1 and root_only.max_depth == 0
    assert root_to_leaf_paths(root_only) == [[0]]
    assert tree_mask(root_only) == [[True]]
    with pytest.raises(ValueError, match='logprobs'):
        chain_tree(5, [8, 9], logprobs=[-1.0])


@pytest.mark.parametrize('fields,name', [
    ({'tokens': ()}, 'tokens'),
    ({'parents': (-1, 0)}, 'parents'),
    ({'parents': (0, 0, 0)}, 'parents'),
    ({'parents': (-1, 2, 0)}, 'parents'),
    ({'depths': (0, 1, 1)}, 'depths'),
    ({'depths': (1, 2, 2)}, 'depths'),
    ({'scores': (-1.0, -1.0, -2.0)}, 'scores'),
])
def test_draft_tree_validation(fields, name):
    base = {'tokens': (1, 2, 3), 'parents': (-1, 0, 1), 'depths': (0, 1, 2),
            'scores': (0.0, -1.0, -2.0)}
    DraftTree(**base)
    with pytest.raises(ValueError, match=name):
        DraftTree(**{**base, **fields})
