"""Unit tests for exact and relaxed acceptance of a verified draft tree (S3/S4, no torch).

Action tokens follow OpenVLA: id = V - 1 - bin for bins 0..255, V = vocab_size -
pad_to_multiple_of = 32064 - 64 (docs/openvla.md, Action tokens).
"""
import random

import pytest

from vla_spec_ros.engine.drafting.acceptance import Acceptance, accept, truncate
from vla_spec_ros.engine.drafting.draft_tree import DraftTree, chain_tree

NUM_TEXT_TOKENS = 32064 - 64
NUM_BINS = 256


def is_action_token(token):
    return NUM_TEXT_TOKENS - NUM_BINS <= token <= NUM_TEXT_TOKENS - 1


def token_to_bin(token):
    return NUM_TEXT_TOKENS - 1 - token


def action(bin_index):
    return NUM_TEXT_TOKENS - 1 - bin_index


def make_tree(tokens, parents):
    depths = []
    for parent in parents:
        depths.append(0 if parent == -1 else depths[parent] + 1)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=[0.0] * len(tokens))


def run(tree, argmax, r):
    return accept(tree, argmax, relax_threshold=r, is_action_token=is_action_token,
                  token_to_bin=token_to_bin)


@pytest.mark.parametrize('r', [1, 5, 9])
def test_draft_within_r_is_accepted_and_kept(r):
    tree = chain_tree(action(3), [action(100)])
    argmax = [action(100 + r), action(42)]
    acc = run(tree, argmax, r)
    assert acc.accepted_nodes == (1,)
    assert acc.accepted_tokens == (action(100),)       # the draft token, not the verifier's
    assert acc.bonus_token == action(42)
    assert acc.num_accepted == 1
    assert acc.bin_distance_sum == r
    assert acc.path_nodes == (0, 1)
    assert acc.emitted_tokens == (action(100), action(42))


@pytest.mark.parametrize('r', [0, 1, 5, 9])
def test_draft_at_r_plus_one_is_rejected(r):
    tree = chain_tree(action(3), [action(100)])
    argmax = [action(100 - (r + 1)), action(42)]
    acc = run(tree, argmax, r)
    assert acc.accepted_nodes == () and acc.accepted_tokens == ()
    assert acc.bonus_token == action(100 - (r + 1))
    assert acc.bin_distance_sum == 0
    assert acc.emitted_tokens == (action(100 - (r + 1)),)


@pytest.mark.parametrize('draft,target', [
    (NUM_TEXT_TOKENS - NUM_BINS - 1, action(255)),   # just below the action range, 1 id apart
    (action(0), NUM_TEXT_TOKENS),                     # just above the action range
    (100, 101),                                       # plain text tokens
    (2, 3),                                           # EOS next to another id
])
def test_non_action_tokens_are_never_relaxed(draft, target):
    assert abs(draft - target) == 1
    tree = chain_tree(1, [draft])
    acc = run(tree, [target, 5], r=50)
    assert acc.num_accepted == 0
    assert acc.bonus_token == target
    # ...while an exact match of a non-action token is accepted
    acc = run(tree, [draft, 5], r=50)
    assert acc.accepted_tokens == (draft,) and acc.bonus_token == 5


def test_acceptance_stops_at_first_rejection():
    tree = chain_tree(1, [action(10), action(20), action(30)])
    # node 1 matches exactly, node 2 is 3 bins off (> r = 2), node 3 would match
    argmax = [action(10), action(23), action(30), action(40)]
    acc = run(tree, argmax, r=2)
    assert acc.accepted_nodes == (1,)
    assert acc.bonus_token == action(23)
    # with r = 3 node 2 is accepted, node 3 compares against argmax[2] and matches
    acc = run(tree, argmax, r=3)
    assert acc.accepted_nodes == (1, 2, 3)
    assert acc.accepted_tokens == (action(10), action(20), action(30))
    assert acc.bin_distance_sum == 3
    assert acc.bonus_token == action(40)


def test_bonus_is_exact_argmax_at_last_accepted_node_never_relaxed():
    tree = chain_tree(1, [action(10)])
    argmax = [action(12), action(77)]
    acc = run(tree, argmax, r=2)
    assert acc.bonus_token == action(77)       # exactly argmax[1], whatever r is
    tree = make_tree((1, action(10), action(11)), (-1, 0, 0))
    acc = run(tree, [action(50), action(1), action(2)], r=5)
    assert acc.num_accepted == 0 and acc.bonus_token == action(50)


def test_longest_path_wins_over_smaller_distance():
    # root -> 1 (exact) -> leaf 3 (rejected); root -> 2 (4 bins off) -> 4 (2 bins off)
    tree = make_tree((1, action(10), action(14), action(60), action(70)), (-1, 0, 0, 1, 2))
    argmax = [action(10), action(99), action(72), action(5), action(6)]
    acc = run(tree, argmax, r=4)
    assert acc.accepted_nodes == (2, 4)
    assert acc.bin_distance_sum == 4 + 2
    assert acc.bonus_token == action(6)


def test_tie_broken_by_smallest_summed_distance():
    # Two depth-2 paths, both fully accepted: via node 1 (3 + 0) and via node 2 (1 + 1).
    tree = make_tree((1, action(13), action(11), action(40), action(41)), (-1, 0, 0, 1, 2))
    argmax = [action(10), action(40), action(42), action(7), action(8)]
    acc = run(tree, argmax, r=3)
    assert acc.accepted_nodes == (2, 4)
    assert acc.bin_distance_sum == 2
    assert acc.accepted_tokens == (action(11), action(41))
    assert acc.bonus_token == action(8)


def test_full_tie_broken_by_lowest_node_indices():
    # Same length, same distance (1 each): the path through the lower indices wins.
    tree = make_tree((1, action(11), action(9), action(40), action(40)), (-1, 0, 0, 2, 1))
    argmax = [action(10), action(40), action(40), action(7), action(8)]
    acc = run(tree, argmax, r=1)
    assert acc.accepted_nodes == (1, 4)
    assert acc.bonus_token == action(8)


def test_r_zero_is_exact_on_close_action_tokens():
    tree = make_tree((1, action(10), action(11)), (-1, 0, 0))
    acc = run(tree, [action(11), action(3), action(4)], r=0)
    assert acc.accepted_nodes == (2,) and acc.bin_distance_sum == 0
    assert acc.bonus_token == action(4)


def reference_accept(tree_parents, tokens, argmax, r):
    """Independent reference: walk every root-to-leaf path, accept its longest valid prefix."""
    num_nodes = len(tokens)
    leaves = [i for i in range(num_nodes) if i not in tree_parents]
    best = None
    for leaf in leaves:
        path = [leaf]
        while tree_parents[path[-1]] != -1:
            path.append(tree_parents[path[-1]])
        path.reverse()                 # root first
        prefix, distance = [0], 0
        for node in path[1:]:
            d, v = tokens[node], argmax[prefix[-1]]
            if d == v:
                step = 0
            elif r > 0 and is_action_token(d) and is_action_token(v) and abs(d - v) <= r:
                step = abs(d - v)      # bin distance equals id distance for OpenVLA tokens
            else:
                break
            prefix.append(node)
            distance += step
        key = (-len(prefix), distance, prefix)
        if best is None or key < best:
            best = key
    _, distance, prefix = best
    return tuple(prefix[1:]), distance, argmax[prefix[-1]]


def random_tree(rng, num_nodes, token_pool):
    parents = [-1] + [rng.randrange(i) for i in range(1, num_nodes)]
    return parents, [rng.choice(token_pool) for _ in range(num_nodes)]


@pytest.mark.parametrize('r', [0, 1, 2, 4])
def test_random_trees_match_reference(r):
    rng = random.Random(1234 + r)
    # A small pool so matches and near-misses are frequent: actions around bins 10..16,
    # plus text tokens right next to the action range and elsewhere.
    pool = [action(b) for b in range(10, 17)] + [NUM_TEXT_TOKENS - NUM_BINS - 1, 100, 101]
    for _ in range(400):
        parents, tokens = random_tree(rng, rng.randrange(1, 12), pool)
        argmax = [rng.choice(pool) for _ in tokens]
        acc = run(make_tree(tokens, parents), argmax, r)
        nodes, distance, bonus = reference_accept(parents, tokens, argmax, r)
        assert acc.accepted_nodes == nodes
        assert acc.accepted_tokens == tuple(tokens[n] for n in nodes)
        assert acc.bin_distance_sum == distance
        assert acc.bonus_token == bonus
        if r == 0:
            assert distance == 0
            assert all(tokens[n] == argmax[p] for p, n in zip((0,) + nodes, nodes))


def test_truncate_emits_drafts_then_bonus_up_to_remaining():
    acc = Acceptance(accepted_nodes=(1, 2, 3), accepted_tokens=(11, 12, 13), bonus_token=99,
                     bin_distance_sum=0)
    assert truncate(acc, 7) == (11, 12, 13, 99)
    assert truncate(acc, 4) == (11, 12, 13, 99)
    assert truncate(acc, 3) == (11, 12, 13)          # bonus dropped
    assert truncate(acc, 1) == (11,)
    none_accepted = Acceptance(accepted_nodes=(), accepted_tokens=(), bonus_token=5,
                               bin_distance_sum=0)
    assert truncate(none_accepted, 1) == (5,)
    with pytest.raises(ValueError, match='max_new_tokens'):
        truncate(acc, 0)


def test_bad_inputs_raise():
    tree = chain_tree(1, [2])
    with pytest.raises(ValueError, match='verifier_argmax'):
        run(tree, [2], r=0)
    with pytest.raises(ValueError, match='relax_threshold'):
        run(tree, [2, 3], r=-1)


# ---- an action after text: relaxation only after the marker -----------------------------------

MARKER = (7, 8)         # the tokens that open the action ("ACTION:")


def test_with_a_marker_text_before_it_is_accepted_only_when_exact():
    # Chain root -> 3 -> 7 -> 8 -> 200 -> 201. Tokens >= 100 are action tokens (bin = id - 100).
    # The verifier answering 4 for the text token 3 stops the path at once (text is exact).
    tree = chain_tree(1, [3, 7, 8, 200, 201])
    is_action, to_bin = (lambda t: t >= 100), (lambda t: t - 100)
    acc = accept(tree, [4, 7, 8, 203, 205, 9], relax_threshold=5, is_action_token=is_action,
                 token_to_bin=to_bin, action_marker=MARKER)
    assert acc.accepted_tokens == () and acc.bonus_token == 4
    # Text exact, then the marker, then action tokens within 5 bins: all accepted.
    acc = accept(tree, [3, 7, 8, 203, 205, 9], relax_threshold=5, is_action_token=is_action,
                 token_to_bin=to_bin, action_marker=MARKER)
    assert acc.accepted_tokens == (3, 7, 8, 200, 201) and acc.bin_distance_sum == 7


def test_action_ids_in_the_text_are_never_relaxed():
    # Action-range ids before the marker (text that happens to use those ids): exact only.
    tree = chain_tree(1, [150, 151, 7, 8, 160])
    is_action, to_bin = (lambda t: t >= 100), (lambda t: t - 100)
    acc = accept(tree, [152, 151, 7, 8, 161, 9], relax_threshold=5, is_action_token=is_action,
                 token_to_bin=to_bin, action_marker=MARKER)
    assert acc.accepted_tokens == () and acc.bonus_token == 152
    # Without a marker the same ids are relaxed (a codec whose whole output is the action).
    acc = accept(tree, [152, 151, 7, 8, 161, 9], relax_threshold=5, is_action_token=is_action,
                 token_to_bin=to_bin)
    assert acc.accepted_tokens == (150, 151, 7, 8, 160)


def test_a_marker_in_the_decided_tokens_or_split_across_them_opens_the_action():
    is_action, to_bin = (lambda t: t >= 100), (lambda t: t - 100)
    tree = chain_tree(8, [200, 201])                 # root 8: "7" was decided before it
    for decided, expected in (((5, 7, 8), (200, 201)), ((5, 6, 8), ())):
        acc = accept(tree, [202, 203, 9], relax_threshold=3, is_action_token=is_action,
                     token_to_bin=to_bin, action_marker=MARKER, decided=decided)
        assert acc.accepted_tokens == expected
