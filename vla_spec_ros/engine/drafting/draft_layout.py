"""The row layout of the EAGLE drafter's forwards (host side, numpy only).

Two kinds of draft forward (engine/drafting/eagle_drafter.py runs them):
- the **update**: every new prompt (one block of rows per prompt, causal inside it) and every
  accepted path (one segment per request, appending its stable positions), in one forward;
- a **tree level**: every growing tree's newest frontier, one segment per tree, each node
  attending to its lane's stable prefix, its ancestors and itself.

Here each forward becomes a ``HostStep`` (engine/device/step_inputs.py) plus the row indices the
forward reads and writes: which verifier feature row feeds each input row, which embedding
row (``prefix_inputs``), which output rows come back and which lanes store them as roots.
With ``pad`` every forward is padded to a shape bucket (``DRAFT_*_BUCKET``) so that a few CUDA
graphs serve all requests; padding rows write the draft cache's scratch slot and the spare
root row only.

Draft positions (the lane layout) are described in engine/drafting/eagle_drafter.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .draft_tree import ROOT
from ..device.step_inputs import (HostStep, PrefillRows, chain_rows, next_power_of_two, pack_step,
                                  round_up, tree_rows)

# Shape buckets of the draft forwards when shapes are padded (``pad``, on with CUDA graphs):
# prompt blocks to a multiple of 64 rows, gathered draft KV to a multiple of 128 slots, the
# verifier features an update reads to a multiple of 256 rows; segment counts and
# accepted-path rows to powers of two, a tree level's rows to top_k.
DRAFT_PROMPT_BUCKET = 64
DRAFT_COLS_BUCKET = 128
DRAFT_FEATURES_BUCKET = 256


@dataclass(frozen=True)
class LaneBegin:
    """A new prompt beginning lane ``lane``: ``length`` rows whose verifier features are
    ``feature_rows``; its first decided token ``root_token`` is the lane's first root."""

    lane: int
    length: int
    feature_rows: Sequence[int]
    root_token: int


@dataclass(frozen=True)
class LaneAdvance:
    """An accepted path of lane ``lane`` (``stable_len`` stable positions so far):
    ``path_tokens`` from the current root, their verifier feature rows, then ``bonus``."""

    lane: int
    stable_len: int
    path_tokens: Sequence[int]
    feature_rows: Sequence[int]
    bonus: int


@dataclass
class UpdateLayout:
    step: HostStep
    # Zero rows to append after each prompt's embeddings (its block is padded to a bucket).
    prompt_padding: list[int]


def update_layout(begins: Sequence[LaneBegin], advances: Sequence[LaneAdvance], lane_len: int,
                  scratch_slot: int, num_lanes: int, pad: bool) -> UpdateLayout:
    """The update forward: prompt blocks first, then one segment per accepted path.

    Input rows of a prompt block: the embeddings e_1..e_{L-1} of its prompt, then its root's
    (``prefix_inputs`` indexes the forward's sources: the roots' embeddings, then every
    prompt block's rows); each row's feature is the verifier's feature of its position. A
    path's rows pair f(path[i]) with the embedding of the token decided after it. Output: each
    prompt's last row and each path's last row, stored as the lane's new root
    (``out_lanes``); padding segments store theirs in the spare root row ``num_lanes``.
    """
    block_rows = round_up(max(b.length for b in begins), DRAFT_PROMPT_BUCKET) \
        if pad and begins else None
    prefills, feature_rows, out_rows, out_lanes, prefix_inputs = [], [], [], [], []
    prompt_padding, block_start = [], 0
    for b, begin in enumerate(begins):
        length = begin.length
        prefills.append(PrefillRows(begin.lane * lane_len, scratch_slot, length))
        block = block_rows or length
        padding = block - length
        feature_rows += list(begin.feature_rows) + [0] * padding
        out_rows.append(block_start + length - 1)
        out_lanes.append(begin.lane)
        first = len(begins) + block_start
        prefix_inputs += list(range(first + 1, first + length)) + [b] + [0] * padding
        prompt_padding.append(padding)
        block_start += block
    num_rows = max((len(a.path_tokens) for a in advances), default=1)
    num_segments = len(advances)
    if pad:
        num_rows = next_power_of_two(num_rows)
        num_segments = next_power_of_two(num_segments) if num_segments else 0
    segments = []
    for s, adv in enumerate(advances):
        path = [int(t) for t in adv.path_tokens]
        segments.append(chain_rows(adv.lane * lane_len, scratch_slot, adv.stable_len,
                                   path[1:] + [int(adv.bonus)]))
        feature_rows += list(adv.feature_rows) + [0] * (num_rows - len(path))
        out_rows.append(block_start + s * num_rows + len(path) - 1)
        out_lanes.append(adv.lane)
    # Padding segments: their rows read feature row 0; their outputs go to the spare root.
    padding_segments = num_segments - len(advances)
    feature_rows += [0] * (padding_segments * num_rows)
    out_rows += [0] * padding_segments
    out_lanes += [num_lanes] * padding_segments
    extras = {'feature_rows': feature_rows, 'out_rows': out_rows, 'out_lanes': out_lanes}
    if begins:
        extras['prefill_token'] = [int(b.root_token) for b in begins]
        extras['prefix_inputs'] = prefix_inputs
    num_cols = round_up(max((seg.num_cols for seg in segments), default=1),
                        DRAFT_COLS_BUCKET) if pad else None
    step = pack_step(prefills, segments, scratch_slot, num_segments=num_segments,
                     num_rows=num_rows, num_cols=num_cols, extras=extras,
                     prefill_rows=block_rows)
    return UpdateLayout(step, prompt_padding)


class FedNodes:
    """One growing tree's candidates fed to the draft so far, as a tree of their own (the
    draft scratch layout): local node 0 is the root (its draft state is the last stable
    position stable_len - 1), local node k sits in lane slot stable_len - 1 + k.
    ``level_layout`` records each fed frontier (``local_of``, ``parents``, ``tokens``); the
    drafter records ``row_of`` once the level's forward has run."""

    def __init__(self, num_candidates: int, root_token: int):
        self.local_of = np.zeros(num_candidates, dtype=np.int64)    # candidate -> local node
        self.row_of = np.zeros(num_candidates, dtype=np.int64)      # candidate -> last row
        self.parents = [-1]                                         # local tree
        self.tokens = [root_token]


@dataclass(frozen=True)
class LevelMember:
    """One growing tree fed at this level: its frontier (candidate ids), their parents
    (candidate ids, ``ROOT`` for the root) and tokens, its lane and stable length."""

    nodes: FedNodes
    lane: int
    stable_len: int
    frontier: np.ndarray
    parents: np.ndarray
    tokens: np.ndarray


def level_layout(members: Sequence[LevelMember], num_roots: int, top_k: int, lane_len: int,
                 scratch_slot: int, pad: bool) -> tuple[HostStep, int]:
    """A tree level's forward: one segment per member, its frontier's rows with the tree
    attention of ``tree_rows``. A node's feature is its parent's draft output: the lane's
    root row, or row ``num_roots + r`` for row r of the previous level's output. Records
    the frontier in each member's ``FedNodes``; returns the step and its rows per segment
    (padded: ``top_k``, a frontier's most)."""
    num_rows = max(m.frontier.size for m in members)
    num_segments = len(members)
    if pad:
        num_rows, num_segments = top_k, next_power_of_two(num_segments)
    segments = []
    feature_rows = np.zeros(num_segments * num_rows, dtype=np.int64)
    for s, m in enumerate(members):
        nodes = m.nodes
        first = len(nodes.parents)
        nodes.local_of[m.frontier] = np.arange(first, first + m.frontier.size)
        nodes.parents += nodes.local_of[m.parents].tolist()
        nodes.tokens += m.tokens.tolist()
        # Attention: the stable prefix, the node's ancestors and the node itself.
        segments.append(tree_rows(m.lane * lane_len, scratch_slot, m.stable_len - 1,
                                  nodes.parents, nodes.tokens,
                                  rows=range(first, len(nodes.parents))))
        feature_rows[s * num_rows:s * num_rows + m.frontier.size] = np.where(
            m.parents == ROOT, m.lane, num_roots + nodes.row_of[m.parents])
    num_cols = round_up(max(seg.num_cols for seg in segments), DRAFT_COLS_BUCKET) \
        if pad else None
    return level_step(segments, feature_rows, num_segments, num_rows, num_cols,
                      scratch_slot), num_rows


def level_step(segments, feature_rows, num_segments: int, num_rows: int,
               num_cols: int | None, scratch_slot: int) -> HostStep:
    """The packed input of one tree level (every row's parent output in ``feature_rows``,
    read from the sources buffer; every row's top-k read back). With no segments: a
    padding-only level that writes the scratch slot alone (graph capture)."""
    return pack_step([], segments, scratch_slot, num_segments=num_segments,
                     num_rows=num_rows, num_cols=num_cols,
                     extras={'feature_rows': feature_rows,
                             'out_rows': np.arange(num_segments * num_rows)})
