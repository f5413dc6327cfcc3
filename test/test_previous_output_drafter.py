"""Lookup drafting (engine/drafting/previous_output_drafter.py): the previous output re-anchored
by context after a mismatch. Plain-Python rule tests (expected chains written out by hand from
the rule in the module docstring), then the engine in float64: with any draft the tokens are
greedy decoding's, in spec and pipeline_spec.
"""
import dataclasses

import numpy as np
import pytest

from vla_spec_ros.engine.drafting.draft_tree import NO_PARENT
from vla_spec_ros.engine.drafting.drafter import DraftAdvance, DraftBegin
from vla_spec_ros.engine.drafting.previous_output_drafter import (PreviousOutputDrafter,
                                                                  anchored_chain)

from helpers import propose_one

# A previous output: words as ids. 1 TASK 2 plan ... 9 ACTION 50..56 (seven bins).
PREVIOUS = [1, 20, 21, 2, 30, 31, 32, 3, 40, 41, 9, 50, 51, 52, 53, 54, 55, 56]


def chain(tree):
    assert tree.parents == (NO_PARENT,) + tuple(range(tree.num_nodes - 1))
    assert tree.scores == (0.0,) * tree.num_nodes
    return tree.tokens[0], tree.tokens[1:]


def begin(request_id, root, stream='cam', before=()):
    return DraftBegin(request_id, None, range(0), root, stream, decided_before_root=before)


# ---- the rule ---------------------------------------------------------------------------------

def test_nothing_decided_drafts_the_previous_output_from_its_start():
    assert anchored_chain([], PREVIOUS, 4, 5) == [1, 20, 21, 2, 30]


def test_the_same_text_continues_where_it_stands():
    # decided 1 20 21 2 -> the 4-gram is found ending at index 4: draft from PREVIOUS[4].
    assert anchored_chain([1, 20, 21, 2], PREVIOUS, 4, 3) == [30, 31, 32]


def test_an_inserted_token_reanchors_on_the_tokens_after_it():
    # The new text has 99 inserted before 30: after "99 30" only the 1-gram "30" is found
    # (ending at index 5), so the chain goes on with 31 32 3 ... (position-wise it would be
    # off by one from here on).
    decided = [1, 20, 21, 2, 99, 30]
    assert anchored_chain(decided, PREVIOUS, 4, 4) == [31, 32, 3, 40]


def test_a_changed_token_reanchors_at_the_next_shared_context():
    # "41" became "77": nothing after 77 is known until the next decided token shares context;
    # with "77 9" decided, the 1-gram "9" finds the action marker: the previous action follows.
    assert anchored_chain([1, 20, 21, 2, 30, 31, 32, 3, 40, 77], PREVIOUS, 4, 8) == []
    assert anchored_chain([1, 20, 21, 2, 30, 31, 32, 3, 40, 77, 9], PREVIOUS, 4, 8) == \
        [50, 51, 52, 53, 54, 55, 56]


def test_of_several_matches_the_one_nearest_the_same_place_wins():
    source = [5, 7, 8, 5, 7, 9, 5, 7, 6]
    # "5 7" ends at indices 2, 5 and 8; with 5 tokens decided the nearest is 5 -> 9 5 7 6.
    assert anchored_chain([0, 1, 2, 5, 7], source, 2, 9) == [9, 5, 7, 6]
    # with 2 decided, index 2 -> 8 5 7 9 ...
    assert anchored_chain([5, 7], source, 2, 3) == [8, 5, 7]


def test_no_shared_context_gives_no_draft():
    assert anchored_chain([1000, 1001], PREVIOUS, 4, 5) == []
    assert anchored_chain([1, 20], [], 4, 5) == []


# ---- the drafter ------------------------------------------------------------------------------

def test_the_drafter_chains_the_stream_output_and_reanchors_after_a_mismatch():
    draft = PreviousOutputDrafter(max_tokens=32)
    draft.observe_action('cam', PREVIOUS, request_id=0)
    assert draft.prefill_draft('cam', 4) == [1, 20, 21, 2]
    draft.update([begin(1, 2, before=(1, 20, 21))], [], None)      # prefill accepted 3
    assert chain(propose_one(draft, 1, depth=32, top_k=1, max_nodes=5)) == (2, (30, 31, 32, 3))
    # The verifier accepted 30 and answered 99 instead of 31 (root 99): "99" is nowhere in
    # the previous output, so no draft this round.
    draft.update([], [DraftAdvance(1, [2, 30], [0, 1], 99)], None)
    assert chain(propose_one(draft, 1, depth=32, top_k=1, max_nodes=50)) == (99, ())
    # Then 31 (the old text resumes): re-anchored on "31", the chain continues 32 3 40 ...
    draft.update([], [DraftAdvance(1, [99], [0], 31)], None)
    assert chain(propose_one(draft, 1, depth=32, top_k=1, max_nodes=50)) == \
        (31, tuple(PREVIOUS[6:]))


def test_max_chain_and_the_remaining_budget_bound_the_chain():
    draft = PreviousOutputDrafter(max_tokens=6, max_chain=3)
    draft.observe_action('cam', PREVIOUS[:6], request_id=0)
    assert draft.prefill_draft('cam', 10) == [1, 20, 21]
    draft.update([begin(1, 20, before=(1,))], [], None)
    assert chain(propose_one(draft, 1, depth=10, top_k=1, max_nodes=50)) == (20, (21, 2, 30))
    draft.update([], [DraftAdvance(1, [20, 21, 2], [0, 1, 2], 30)], None)   # 5 decided of 6
    assert chain(propose_one(draft, 1, depth=10, top_k=1, max_nodes=50)) == (30, (31,))


def test_streams_are_separate_and_a_reset_forgets_one():
    draft = PreviousOutputDrafter(max_tokens=32)
    draft.observe_action('a', PREVIOUS, request_id=0)
    draft.observe_action('b', [7, 8, 9], request_id=1)
    assert draft.prefill_draft('a', 3) == [1, 20, 21]
    assert draft.prefill_draft('b', 3) == [7, 8, 9]
    draft.forget_stream('a')
    assert draft.prefill_draft('a', 3) == [] and draft.prefill_draft('b', 3) == [7, 8, 9]
    draft.forget_stream(None)
    assert draft.prefill_draft('b', 3) == []


def test_a_newer_frame_in_flight_is_drafted_from_first_and_a_request_never_from_itself():
    draft = PreviousOutputDrafter(max_tokens=32)
    draft.observe_action('cam', PREVIOUS, request_id=0)
    draft.update([begin(1, 1)], [], None)
    draft.update([begin(2, 1)], [], None)
    draft.update([], [DraftAdvance(2, [1], [0], 88)], None)      # frame 2 decided 1 88
    # Frame 1 (decided "1") drafts from the newest other output, frame 2's "1 88".
    assert chain(propose_one(draft, 1, depth=32, top_k=1, max_nodes=50)) == (1, (88,))
    # Frame 2 (decided "1 88"): "88" is only in its own output; "1"... its 1-gram "88" has no
    # match in frame 1 ("1") or in the previous output: no draft.
    assert chain(propose_one(draft, 2, depth=32, top_k=1, max_nodes=50)) == (88, ())


def test_errors_name_what_is_wrong():
    draft = PreviousOutputDrafter(max_tokens=4)
    with pytest.raises(ValueError, match='max_tokens'):
        PreviousOutputDrafter(max_tokens=0)
    with pytest.raises(ValueError, match='max_chain'):
        PreviousOutputDrafter(max_tokens=4, max_chain=0)
    with pytest.raises(ValueError, match='stream_id'):
        draft.update([begin(0, 1, stream='')], [], None)
    with pytest.raises(ValueError, match='tokens'):
        draft.observe_action('cam', [1] * 5, request_id=0)
    with pytest.raises(ValueError, match='request_id'):
        propose_one(draft, 7, depth=1, top_k=1, max_nodes=2)


# ---- through the engine (float64) -------------------------------------------------------------

@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('lookup') / 'tiny', seed=1)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_lookup_drafting_gives_greedy_tokens_on_repeated_and_drifting_frames(policy, mode):
    from vla_spec_ros.config import EngineConfig
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    from vla_spec_ros.engine.engine import Engine
    from vla_spec_ros.engine.result import Frame

    from helpers import serve_streams
    from reference import ar_reference_tokens

    rng = np.random.default_rng(4)
    scenes = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(4)]
    frames = []
    for i in range(16):          # each scene three times, then drifting by a little noise
        image = scenes[i // 4].copy()
        if i % 4 == 3:
            image = np.clip(image.astype(int) + rng.integers(-3, 4, image.shape), 0, 255)
        frames.append(Frame(image.astype(np.uint8), 'open the drawer', 'bridge_orig',
                            f'cam{i % 2}'))
    reference = ar_reference_tokens(policy, frames)
    cfg = EngineConfig(dtype='float64', mode=mode, draft_path='previous_output')
    runner = policy.engine.runner
    drafter = load_draft_for(runner, cfg, None)
    engine = Engine(runner, policy.engine.norm_stats, cfg, draft=drafter)
    out = serve_streams(engine, [dataclasses.replace(f) for f in frames])
    got = [fin.result.tokens for fin in sorted(out, key=lambda f: f.request_id)]
    assert got == reference
    assert engine.strategy.drafter.num_forward_passes == 0
    accepted = [fin.result.stats['prefill_accepted'] for fin in out]
    assert max(accepted) > 0                   # repeated scenes are drafted and accepted
