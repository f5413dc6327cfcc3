"""The row layout of the drafter's forwards (engine/drafting/draft_layout.py), plain Python and
numpy: every index below is derived by hand from the layout's rules, not read off the code."""
import numpy as np

from vla_spec_ros.engine.drafting.draft_layout import (DRAFT_PROMPT_BUCKET, FedNodes, LaneAdvance,
                                                       LaneBegin, LevelMember, level_layout,
                                                       update_layout)
from vla_spec_ros.engine.drafting.draft_tree import ROOT

LANE_LEN, NUM_LANES = 100, 4
SCRATCH = NUM_LANES * LANE_LEN


def two_prompts_and_a_path(pad=False):
    begins = [LaneBegin(lane=2, length=3, feature_rows=[10, 11, 12], root_token=50),
              LaneBegin(lane=0, length=5, feature_rows=[20, 21, 22, 23, 24], root_token=60)]
    advances = [LaneAdvance(lane=1, stable_len=10, path_tokens=[7, 8], feature_rows=[30, 31],
                            bonus=9)]
    return update_layout(begins, advances, LANE_LEN, SCRATCH, NUM_LANES, pad)


def test_update_layout_tight():
    layout = two_prompts_and_a_path()
    step, extras = layout.step, layout.step.extras
    assert layout.prompt_padding == [0, 0]
    assert step.prefill_blocks == (3, 5)
    # Sources: the two roots' embeddings (0, 1), then the prompt rows (2 ..): a prompt's
    # inputs are its rows 1 .. L-1, then its root's embedding.
    assert extras['prefix_inputs'].tolist() == [3, 4, 0, 6, 7, 8, 9, 1]
    assert extras['prefill_token'].tolist() == [50, 60]
    assert extras['feature_rows'].tolist() == [10, 11, 12, 20, 21, 22, 23, 24, 30, 31]
    # Outputs: each prompt's last row (2, 7) and the path's last row (8 + 1), stored as the
    # roots of lanes 2, 0 and 1.
    assert extras['out_rows'].tolist() == [2, 7, 9]
    assert extras['out_lanes'].tolist() == [2, 0, 1]
    # Prompt rows at their lane's stable positions 0 .., the path's new stable positions
    # 10, 11 of lane 1 (inputs: the token decided after each path node: 8, then the bonus 9).
    assert step.slot_mapping.tolist() == [200, 201, 202, 0, 1, 2, 3, 4, 110, 111]
    assert step.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 10, 11]
    assert step.token_ids.tolist() == [8, 9]
    assert step.kv_index.tolist() == [list(range(100, 112))]


def test_update_layout_padded_to_buckets():
    layout = two_prompts_and_a_path(pad=True)
    step, extras = layout.step, layout.step.extras
    block = DRAFT_PROMPT_BUCKET
    assert layout.prompt_padding == [block - 3, block - 5]
    assert step.prefill_blocks == (block, block)
    # Padded rows take source 0 and feature row 0 and write the scratch slot.
    inputs = extras['prefix_inputs'].tolist()
    assert inputs[:3] == [3, 4, 0] and set(inputs[3:block]) == {0}
    assert inputs[block:block + 5] == [2 + block + 1, 2 + block + 2, 2 + block + 3,
                                       2 + block + 4, 1]
    assert extras['out_rows'].tolist() == [2, block + 4, 2 * block + 1]
    assert set(step.slot_mapping[3:block].tolist()) == {SCRATCH}
    # One path of two rows: one segment of two rows (powers of two), 128 gathered slots.
    assert step.mask.shape == (1, 2, 128)
    assert extras['feature_rows'].tolist()[-2:] == [30, 31]


def test_update_layout_pads_path_segments_to_the_spare_root():
    advances = [LaneAdvance(lane=lane, stable_len=10, path_tokens=[1, 2, 3][:n],
                            feature_rows=list(range(n)), bonus=4)
                for lane, n in ((0, 3), (1, 1), (3, 2))]
    step = update_layout([], advances, LANE_LEN, SCRATCH, NUM_LANES, pad=True).step
    # 3 paths -> 4 segments of 4 rows (the longest path, 3, rounded up).
    assert step.mask.shape[:2] == (4, 4)
    assert step.extras['out_rows'].tolist() == [2, 4, 9, 0]
    assert step.extras['out_lanes'].tolist() == [0, 1, 3, NUM_LANES]
    assert 'prefix_inputs' not in step.extras and step.prefill_blocks == ()
    # Each path's feature rows, padded with row 0 to its segment's 4 rows; the padding
    # segment's 4 rows read row 0 too.
    assert step.extras['feature_rows'].tolist() == [0, 1, 2, 0, 0, 0, 0, 0, 0, 1, 0, 0,
                                                    0, 0, 0, 0]


def test_level_layout_feeds_frontiers_with_their_parents_outputs():
    # Candidate ids are the growing tree's: 0 is the root (``ROOT``).
    # Tree A (lane 1, 7 stable positions): candidates 1, 2 are the root's children, fed now.
    a = FedNodes(num_candidates=6, root_token=5)
    member_a = LevelMember(a, lane=1, stable_len=7, frontier=np.array([1, 2]),
                           parents=np.array([ROOT, ROOT]), tokens=np.array([40, 41]))
    # Tree B (lane 3): candidate 1 was fed at the previous level as local node 1, in output
    # row 4; now its children 3 and 4 are fed.
    b = FedNodes(num_candidates=6, root_token=6)
    b.local_of[1], b.row_of[1] = 1, 4
    b.parents, b.tokens = [-1, 0], [6, 42]
    member_b = LevelMember(b, lane=3, stable_len=9, frontier=np.array([3, 4]),
                           parents=np.array([1, 1]), tokens=np.array([43, 44]))
    num_roots = NUM_LANES + 1
    step, num_rows = level_layout([member_a, member_b], num_roots, top_k=4,
                                  lane_len=LANE_LEN, scratch_slot=SCRATCH, pad=False)
    assert num_rows == 2
    # A's nodes read lane 1's root row; B's read the previous level's row 4 after the roots.
    assert step.extras['feature_rows'].tolist() == [1, 1, num_roots + 4, num_roots + 4]
    assert step.extras['out_rows'].tolist() == [0, 1, 2, 3]
    # Positions: stable_len - 1 + depth; slots: the scratch after the last stable one.
    assert step.positions.tolist() == [7, 7, 10, 10]
    assert step.slot_mapping.tolist() == [107, 108, 310, 311]
    assert step.token_ids.tolist() == [40, 41, 43, 44]
    # The fed trees grew: A's root and its two children; B's third and fourth nodes under 1.
    assert a.parents == [-1, 0, 0] and a.tokens == [5, 40, 41]
    assert b.parents == [-1, 0, 1, 1] and b.local_of[[3, 4]].tolist() == [2, 3]
    # Each node sees its lane's stable prefix, its ancestors and itself: B's first node sees
    # B's 9 stable slots (300 .. 308, the last one the root's), local node 1 (309) and itself.
    row = step.mask[1, 0]
    visible = set(step.kv_index[1][row].tolist())
    assert visible == set(range(300, 309)) | {309, 310}


def test_level_layout_padded():
    """Padded: a frontier's rows to top_k, the segment count to a power of two; padding rows
    read feature row 0 and write the scratch slot."""
    a = FedNodes(num_candidates=8, root_token=5)
    member_a = LevelMember(a, lane=2, stable_len=3, frontier=np.array([1]),
                           parents=np.array([ROOT]), tokens=np.array([9]))
    b = FedNodes(num_candidates=8, root_token=6)
    b.local_of[1], b.row_of[1] = 1, 6
    b.parents, b.tokens = [-1, 0], [6, 7]
    member_b = LevelMember(b, lane=1, stable_len=5, frontier=np.array([2, 3, 4]),
                           parents=np.array([1, 1, 1]), tokens=np.array([10, 11, 12]))
    c = FedNodes(num_candidates=8, root_token=8)
    member_c = LevelMember(c, lane=3, stable_len=4, frontier=np.array([1, 2]),
                           parents=np.array([ROOT, ROOT]), tokens=np.array([13, 14]))
    num_roots = NUM_LANES + 1
    step, num_rows = level_layout([member_a, member_b, member_c], num_roots, top_k=4,
                                  lane_len=LANE_LEN, scratch_slot=SCRATCH, pad=True)
    assert num_rows == 4 and step.mask.shape == (4, 4, 128)     # 3 trees -> 4 segments
    assert step.extras['feature_rows'].tolist() == [
        2, 0, 0, 0,                                         # A: lane 2's root row
        num_roots + 6, num_roots + 6, num_roots + 6, 0,     # B: the previous level's row 6
        3, 3, 0, 0,                                         # C: lane 3's root row
        0, 0, 0, 0]                                         # the padding segment
    assert step.slot_mapping.tolist() == [
        203, SCRATCH, SCRATCH, SCRATCH,                     # A: slot stable_len - 1 + 1
        106, 107, 108, SCRATCH,                             # B: stable_len - 1 + 2 ..
        304, 305, SCRATCH, SCRATCH,                         # C: stable_len - 1 + 1 ..
        SCRATCH, SCRATCH, SCRATCH, SCRATCH]
    assert step.extras['out_rows'].tolist() == list(range(16))
