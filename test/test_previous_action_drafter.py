"""Temporal drafting (engine/drafting/previous_action_drafter.py), plain Python: the chains it
proposes from each stream's newest decided tokens, its bookkeeping, and its errors. Expected trees
are derived by hand from the rule "after d decided tokens, propose newest[d], newest[d+1], ... up
to the first position no frame of the stream has decided", where newest[i] is the token of the
highest request id that decided position i."""
import pytest

from vla_spec_ros.engine.drafting.draft_tree import NO_PARENT
from vla_spec_ros.engine.drafting.drafter import DraftAdvance, DraftBegin
from vla_spec_ros.engine.drafting.previous_action_drafter import PreviousActionDrafter

from helpers import propose_one

ACTION_DIM = 7
PREVIOUS = (11, 12, 13, 14, 15, 16, 17)


def begin(request_id, root, stream='cam'):
    return DraftBegin(request_id, None, range(0), root, stream)


def chain(tree):
    """(root, drafted tokens) of a chain tree, after checking it is a chain."""
    assert tree.parents == (NO_PARENT,) + tuple(range(tree.num_nodes - 1))
    assert tree.depths == tuple(range(tree.num_nodes))
    assert tree.scores == (0.0,) * tree.num_nodes
    return tree.tokens[0], tree.tokens[1:]


def test_a_stream_without_an_action_gets_the_root_alone():
    draft = PreviousActionDrafter(ACTION_DIM)
    assert draft.previous_action('cam') is None
    draft.update([begin(0, 99)], [], None)
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == (99, ())
    assert draft.previous_action('cam') == (99,) + (None,) * 6


def test_the_chain_continues_the_previous_action_after_the_decided_tokens():
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.observe_action('cam', PREVIOUS, request_id=-1)     # an older frame's action
    draft.update([begin(0, 11)], [], None)                  # the prefill decided 1 token
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == (11, PREVIOUS[1:])
    # Verified: root 11 then 12 accepted, bonus 40: three tokens decided, root 40.
    draft.update([], [DraftAdvance(0, [11, 12], [0, 1], 40)], None)
    assert draft.previous_action('cam') == (11, 12, 40, 14, 15, 16, 17)    # frame 0 is newer
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == (40, (14, 15, 16, 17))


def test_depth_and_max_nodes_bound_the_chain():
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.observe_action('cam', PREVIOUS, request_id=-1)
    draft.update([begin(0, 5)], [], None)
    assert chain(propose_one(draft, 0, depth=2, top_k=8, max_nodes=50)) == (5, (12, 13))
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=4)) == (5, (12, 13, 14))
    # top_k and min_prob have nothing to act on: the chain carries no probabilities.
    assert chain(propose_one(draft, 0, depth=6, top_k=1, max_nodes=50, min_prob=0.99)) == \
        (5, PREVIOUS[1:])


def test_each_request_drafts_from_its_own_stream_and_the_newest_action():
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.observe_action('left', PREVIOUS, request_id=-2)
    draft.observe_action('right', tuple(range(100, 107)), request_id=-1)
    draft.update([begin(0, 1, 'left'), begin(1, 2, 'right'), begin(2, 3, 'new')], [], None)
    trees = draft.propose_batch([0, 1, 2], [6, 6, 6], top_k=8, max_nodes=50)
    assert [chain(t) for t in trees] == [(1, PREVIOUS[1:]), (2, (101, 102, 103, 104, 105, 106)),
                                         (3, ())]
    # A newer action of the stream is used from the next proposal on, also by a request
    # already in flight.
    draft.observe_action('left', tuple(range(20, 27)), request_id=10)
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == \
        (1, (21, 22, 23, 24, 25, 26))


def test_frames_in_flight_together_draft_from_the_newest_decided_tokens():
    """Pipelining: frame 1 of a stream is admitted while frame 0 is still deciding. Frame 1
    drafts from what frame 0 has decided so far (and frame 0, once frame 1 is ahead at a
    position, from frame 1's token there); the chain stops at the first undecided
    position."""
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.observe_action('cam', PREVIOUS, request_id=-1)       # an older frame's action
    draft.update([begin(0, 30)], [], None)                     # frame 0 decided position 0
    draft.update([], [DraftAdvance(0, [30, 31], [0, 1], 32)], None)    # ... and 1, 2
    draft.update([begin(1, 40)], [], None)                     # frame 1 decided position 0
    # Frame 1 after 1 decided token: frame 0's positions 1, 2, then the older action's.
    assert chain(propose_one(draft, 1, depth=6, top_k=8, max_nodes=50)) == \
        (40, (31, 32, 14, 15, 16, 17))
    # Frame 1 moves ahead to positions 1..4: frame 0 (3 decided) drafts frame 1's 3, 4.
    draft.update([], [DraftAdvance(1, [40, 41, 42, 43], range(4), 44)], None)
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == (32, (43, 44, 16, 17))
    # An older frame's action, reported late, never overwrites a newer frame's tokens.
    draft.observe_action('cam', (7,) * ACTION_DIM, request_id=0)
    assert draft.previous_action('cam') == (40, 41, 42, 43, 44, 7, 7)
    # A stream whose frames decided only positions 0..2 so far: the chain stops at 3.
    draft.update([begin(2, 50, 'other')], [], None)
    draft.update([], [DraftAdvance(2, [50, 51], [0, 1], 52)], None)
    draft.update([begin(3, 60, 'other')], [], None)
    assert chain(propose_one(draft, 3, depth=6, top_k=8, max_nodes=50)) == (60, (51, 52))


def test_forgetting_a_stream_drops_its_action_only():
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.observe_action('left', PREVIOUS, request_id=-2)
    draft.observe_action('right', PREVIOUS, request_id=-1)
    draft.forget_stream('left')
    assert draft.previous_action('left') is None and draft.previous_action('right') == PREVIOUS
    draft.forget_stream(None)
    assert draft.previous_action('right') is None


def test_a_finished_request_past_the_previous_action_gets_the_root_alone():
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.observe_action('cam', PREVIOUS, request_id=-1)
    draft.update([begin(0, 11)], [], None)
    draft.update([], [DraftAdvance(0, [11, 12, 13, 14, 15, 16], range(6), 17)], None)
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == (17, ())


def test_release_forgets_the_request():
    draft = PreviousActionDrafter(ACTION_DIM)
    draft.update([begin(0, 11)], [], None)
    draft.release(0)
    draft.release(0)                                    # twice is harmless
    with pytest.raises(ValueError, match='no draft state'):
        propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)
    draft.update([begin(0, 11)], [], None)              # the id may begin again


def test_errors_name_what_is_wrong():
    draft = PreviousActionDrafter(ACTION_DIM)
    with pytest.raises(ValueError, match='max_tokens'):
        PreviousActionDrafter(0)
    with pytest.raises(ValueError, match='an action has 1 to 7 tokens'):
        draft.observe_action('cam', tuple(range(8)), request_id=0)
    with pytest.raises(ValueError, match='an action has 1 to 7 tokens'):
        draft.observe_action('cam', (), request_id=0)
    draft.update([begin(0, 11)], [], None)
    with pytest.raises(ValueError, match='already has a draft state'):
        draft.update([begin(0, 11)], [], None)
    with pytest.raises(ValueError, match='stream_id: temporal drafting needs the stream'):
        draft.update([DraftBegin(1, None, range(0), 11)], [], None)
    with pytest.raises(ValueError, match='num_decided|no draft state'):
        draft.num_decided(1)
    with pytest.raises(ValueError, match='must start with the current root 11'):
        draft.update([], [DraftAdvance(0, [12], [0], 13)], None)
    with pytest.raises(ValueError, match='exceed the action'):
        draft.update([], [DraftAdvance(0, [11] + [1] * 6, range(7), 13)], None)
    with pytest.raises(ValueError, match='no draft state'):
        draft.update([], [DraftAdvance(5, [1], [0], 2)], None)
    with pytest.raises(ValueError, match='depth'):
        propose_one(draft, 0, depth=0, top_k=8, max_nodes=50)
    with pytest.raises(ValueError, match='max_nodes'):
        propose_one(draft, 0, depth=2, top_k=8, max_nodes=1)
    with pytest.raises(ValueError, match='depths'):
        draft.propose_batch([0], [2, 2], top_k=8, max_nodes=50)
    # A failed update changed nothing: the request still drafts from its first root.
    draft.observe_action('cam', PREVIOUS, request_id=-1)
    assert chain(propose_one(draft, 0, depth=6, top_k=8, max_nodes=50)) == (11, PREVIOUS[1:])


def test_the_match_script_counts_verifications_as_the_engine_accepts():
    """bench/temporal_match.py's arithmetic: after the prefill's token, each verification
    accepts the previous action up to its first wrong token and adds the verifier's own."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'bench'))
    from temporal_match import verifications
    same = (1, 2, 3, 4, 5, 6, 7)
    assert verifications(same, same) == 1                           # all six in one
    assert verifications(same, (0, 9, 9, 9, 9, 9, 9)) == 6           # AR: nothing drafted right
    # position 3 wrong: positions 1, 2 accepted and 3 is the bonus; then 4, 5, 6 accepted
    assert verifications(same, (1, 2, 3, 0, 5, 6, 7)) == 2
    assert verifications(same, (1, 0, 3, 4, 5, 6, 7)) == 2           # bonus at 2, then 3..7


# ---- the previous action merged into a draft model's trees (engine/drafting/temporal_merge.py)

def test_merge_chain_follows_existing_nodes_and_appends_the_rest():
    from vla_spec_ros.engine.drafting.draft_tree import DraftTree
    from vla_spec_ros.engine.drafting.temporal_merge import merge_chain
    # root 5 -> 7 (node 1) -> 9 (node 3); root 5 -> 8 (node 2)
    tree = DraftTree(tokens=(5, 7, 8, 9), parents=(NO_PARENT, 0, 0, 1), depths=(0, 1, 1, 2),
                     scores=(0.0, -0.5, -1.0, -1.5))
    merged = merge_chain(tree, [7, 9, 10])          # follows 1 and 3, appends 10 below 3
    assert merged.tokens == (5, 7, 8, 9, 10)
    assert merged.parents == (NO_PARENT, 0, 0, 1, 3)
    assert merged.depths == (0, 1, 1, 2, 3)
    assert merged.scores == (0.0, -0.5, -1.0, -1.5, -1.5)
    merged = merge_chain(tree, [8, 1, 2])           # follows 2, appends a path of two
    assert merged.tokens[4:] == (1, 2) and merged.parents[4:] == (2, 4)
    assert merged.depths[4:] == (2, 3) and merged.scores[4:] == (-1.0, -1.0)
    merged = merge_chain(tree, [6])                 # a new child of the root
    assert merged.tokens[4:] == (6,) and merged.parents[4:] == (0,)
    assert merge_chain(tree, []) is tree and merge_chain(tree, [7, 9]) is tree


class _FixedTrees:
    """A stand-in draft model: every tree is root -> 100 -> 101 (or the root alone when the
    node budget is 2 or less), and it records its calls; ``refuse`` makes update raise."""

    num_forward_passes, forward_s = 3, 0.25

    def __init__(self):
        self.calls, self.updates, self.refuse = [], [], False

    def propose_batch(self, request_ids, depths, top_k, max_nodes, min_prob=0.0):
        from vla_spec_ros.engine.drafting.draft_tree import chain_tree
        self.calls.append((list(request_ids), max_nodes))
        return [chain_tree(900 + r, [100, 101][:max_nodes - 1]) for r in request_ids]

    def update(self, begins, advances, features):
        if self.refuse:
            raise RuntimeError('no lane left')
        self.updates.append((list(begins), list(advances)))

    def release(self, request_id):
        pass

    def observe_action(self, stream_id, tokens, request_id, step=None):
        pass

    def forget_stream(self, stream_id):
        pass


def test_with_previous_action_leaves_room_for_the_chain_and_merges_it():
    from vla_spec_ros.engine.drafting.temporal_merge import WithPreviousAction
    model = _FixedTrees()
    draft = WithPreviousAction(model, ACTION_DIM)
    draft.update([begin(0, 900, 'a'), begin(1, 901, 'b')], [], None)
    draft.observe_action('a', PREVIOUS, request_id=-1)
    trees = draft.propose_batch([0, 1], [6, 6], top_k=8, max_nodes=9)
    # Request 0 drafts a 6-token chain: the model gets 9 - 6 = 3 nodes; request 1 (stream b,
    # nothing decided) none: the model gets all 9. One model call per budget.
    assert sorted(model.calls) == [([0], 3), ([1], 9)]
    assert trees[0].tokens == (900, 100, 101) + PREVIOUS[1:]
    assert trees[0].parents == (NO_PARENT, 0, 1, 0, 3, 4, 5, 6, 7)
    assert trees[1].tokens == (901, 100, 101)
    assert all(t.num_nodes <= 9 for t in trees)
    # A budget too small for the model's two nodes plus the whole chain: the chain is cut.
    trees = draft.propose_batch([0], [6], top_k=8, max_nodes=4)
    assert trees[0].num_nodes == 4 and trees[0].tokens == (900, 100, 12, 13)
    assert (draft.num_forward_passes, draft.forward_s) == (3, 0.25)   # the model's


def test_with_previous_action_updates_both_or_neither():
    from vla_spec_ros.engine.drafting.temporal_merge import WithPreviousAction
    model = _FixedTrees()
    draft = WithPreviousAction(model, ACTION_DIM)
    with pytest.raises(ValueError, match='stream_id'):      # the chain's check: model untouched
        draft.update([DraftBegin(0, None, range(0), 5)], [], None)
    assert model.updates == []
    model.refuse = True                                     # the model refuses: chain untouched
    with pytest.raises(RuntimeError, match='no lane'):
        draft.update([begin(0, 5)], [], None)
    assert draft.temporal.previous_action('cam') is None
    model.refuse = False
    draft.update([begin(0, 5)], [], None)
    assert len(model.updates) == 1 and draft.temporal.num_decided(0) == 1


# ---- chunks: the previous chunk shifted by the control steps between two frames ----------

CHUNK = (1, 2, 3, 4, 5, 6)          # K = 3 steps of D = 2 tokens: steps (1, 2), (3, 4), (5, 6)


def test_a_chunk_is_shifted_by_the_steps_between_frames_and_its_last_step_repeated():
    draft = PreviousActionDrafter(6, step_tokens=2)
    assert draft.num_steps == 3
    draft.observe_action('cam', CHUNK, request_id=0, step=10)
    assert draft.prefill_draft('cam', 6, step=10) == [1, 2, 3, 4, 5, 6]     # same step
    assert draft.prefill_draft('cam', 6, step=11) == [3, 4, 5, 6, 5, 6]     # one step on
    assert draft.prefill_draft('cam', 6, step=12) == [5, 6, 5, 6, 5, 6]
    assert draft.prefill_draft('cam', 6, step=30) == [5, 6, 5, 6, 5, 6]     # long after
    assert draft.prefill_draft('cam', 6) == [5, 6, 5, 6, 5, 6]      # step unknown: hold
    assert draft.prefill_draft('cam', 3, step=11) == [3, 4, 5]


def test_a_newer_frame_in_flight_drafts_the_steps_it_has_decided():
    draft = PreviousActionDrafter(6, step_tokens=2)
    draft.observe_action('cam', CHUNK, request_id=0, step=10)
    # Frame 1 (step 12) decided its first step and one token of its second.
    draft.update([DraftBegin(1, None, range(0), 9, 'cam', decided_before_root=(7, 8),
                             step=12)], [], None)
    # A frame at step 13: step 13 from frame 1 (dimension 0 decided, dimension 1 not yet:
    # frame 1's newest step for it), then nothing newer: frame 1's latest steps held.
    assert draft.prefill_draft('cam', 6, step=13) == [9, 8, 9, 8, 9, 8]
    # Frame 1 itself, 3 tokens decided: step 13's dimension 1 comes from nobody at step 13
    # (frame 0 covers 10..12), so its own latest step for dimension 1 is held.
    assert chain(propose_one(draft, 1, depth=6, top_k=1, max_nodes=50)) == (9, (8, 9, 8))


def test_chunk_steps_must_divide_the_frame():
    with pytest.raises(ValueError, match='step_tokens'):
        PreviousActionDrafter(7, step_tokens=2)


def test_draft_repair_check_gives_the_ar_tokens_with_every_draft(tmp_path):
    """bench/draft_repair.py's simulated verification (dense forwards, exact acceptance) gives
    the AR tokens for each draft rule, from a right, a partly right and a wrong first draft,
    and a right draft is decided in one forward."""
    import sys
    from pathlib import Path
    import numpy as np
    from vla_spec_ros.engine.ar import decode_ar
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    from vla_spec_ros.policy import VLAPolicy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'bench'))
    from draft_repair import DRAFTS, verify_rounds
    policy = VLAPolicy.from_pretrained(str(make_checkpoint('tiny', tmp_path / 'tiny', seed=3)),
                                       mode='ar', dtype='float64')
    runner = policy.engine.runner
    rng = np.random.default_rng(4)
    frame = Frame(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), 'pick up the cup',
                  'bridge_orig', 'cam0')
    prompt = runner.prepare_prompt(frame, policy.config).embeds
    reference, _ = decode_ar(runner, prompt, runner.max_action_tokens)
    partly = list(reference[:3]) + [t + 1 for t in reference[3:]]
    wrong = [t + 1 for t in reference]
    for kind in DRAFTS:
        assert verify_rounds(runner, prompt, list(reference), kind) == (1, list(reference))
        for draft in (partly, wrong):
            forwards, tokens = verify_rounds(runner, prompt, draft, kind)
            assert tokens == list(reference) and 2 <= forwards <= runner.max_action_tokens
    # An earlier action of the stream that is right decides a wrong previous action's frame
    # in one forward, beside a wrong one in the history.
    history = (tuple(partly), tuple(reference))
    assert verify_rounds(runner, prompt, wrong, 'history', history) == (1, list(reference))
