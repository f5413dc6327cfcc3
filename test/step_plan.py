"""The test oracle of a packed step's index plan and attention rule (plain Python, no torch).

ActionFlow packs one prefill and one decode token per in-flight request into a single forward
pass; speculation replaces a decode token with a draft tree (EAGLE-2 tree attention). All
segments are laid end to end along one token axis T (no batch dimension), each attending only
to its own request's KV in the ring. The engine builds its device inputs with the packer of
step_inputs.py (tree masks from ``step_inputs.ancestor_mask``); this module states the same
rule one token at a time (``StepPlan.allowed_slots``), written for reading, and the tests hold
the packer to it. It is deliberately a formulation of its own (a walk up the parents, not a
call of ``ancestor_mask``) so that the comparison means something; the engine never imports
it.

Segment kinds are those of the engine's packed step: the admitted frame's causal ``prefill``
and one ``tree`` per in-flight request (a decode token is a root-only tree, a chain of tokens a
tree whose node i has parent i - 1).

Terms. A segment's ``history_len`` is the number of KV entries its request already has in the
ring, at logical indices 0 .. history_len - 1 of its span. Its ``num_tokens`` new tokens write
their KV to logical indices history_len .. history_len + num_tokens - 1 (for a tree, node i
goes to logical index history_len + i, so the nodes occupy the request's scratch slots until
the accepted path is compacted). RoPE positions are logical, never physical: token i of a
causal segment sits at history_len + i, tree node i at history_len + depth(i).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

from vla_spec_ros.engine.drafting.draft_tree import NO_PARENT
from vla_spec_ros.engine.scheduling.kv_ring import KVRing

SEGMENT_KINDS = ('prefill', 'tree')


@dataclass(frozen=True)
class SegmentSpec:
    """One request's share of a packed step.

    ``parents`` is given for ``kind == 'tree'`` only: parents[0] == NO_PARENT (node 0 is the
    root, the last decided token) and 0 <= parents[i] < i for every other node. A prefill
    segment is causal among its own tokens.
    """

    request_id: int
    history_len: int
    num_tokens: int
    kind: str
    parents: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.kind not in SEGMENT_KINDS:
            raise ValueError(f'kind: must be one of {SEGMENT_KINDS}, got {self.kind!r}')
        if self.history_len < 0:
            raise ValueError(f'history_len: must be >= 0, got {self.history_len}')
        if self.num_tokens < 1:
            raise ValueError(f'num_tokens: must be >= 1, got {self.num_tokens}')
        if self.kind != 'tree':
            if self.parents is not None:
                raise ValueError(f'parents: only tree segments have parents, got kind '
                                 f'{self.kind!r}')
            return
        if self.parents is None or len(self.parents) != self.num_tokens:
            raise ValueError(f'parents: a tree segment needs one parent per node '
                             f'({self.num_tokens}), got {self.parents!r}')
        object.__setattr__(self, 'parents', tuple(int(p) for p in self.parents))
        if self.parents[0] != NO_PARENT:
            raise ValueError(f'parents: node 0 is the root and must have parent {NO_PARENT}')
        for node in range(1, self.num_tokens):
            if not 0 <= self.parents[node] < node:
                raise ValueError(f'parents: node {node} has parent {self.parents[node]}; '
                                 'parents must precede their children')

    def depths(self) -> list[int]:
        """Depth of each new token: i for causal segments, tree depth for trees."""
        if self.parents is None:
            return list(range(self.num_tokens))
        depths = [0] * self.num_tokens
        for node in range(1, self.num_tokens):
            depths[node] = depths[self.parents[node]] + 1
        return depths


@dataclass(frozen=True)
class StepPlan:
    """Index data of one packed step; S = number of segments, T = total new tokens.

    Lists are read-only by contract. Field contracts:
    - request_ids (S,), kinds (S,): the segments in packing order.
    - positions (T,): logical RoPE position of each packed token within its own request.
    - slot_mapping (T,): physical ring slot where each packed token's K/V is written.
    - cu_seqlens_q (S+1,): segment s owns packed tokens cu_seqlens_q[s] .. cu_seqlens_q[s+1]-1.
    - history_lens (S,): KV entries of the request already in the ring before this step.
    - kv_slots (S, history_lens[s] + num_tokens): physical slots the segment's queries may
      read, history in logical order (index 0 = BOS) followed by the segment's own new tokens
      in packing order;
      kv_slots[s][history_lens[s]:] == slot_mapping[cu_seqlens_q[s]:cu_seqlens_q[s+1]].
    - tree_parents (S,): None for a causal segment, else the tree's parent list (node order).

    Attention rule (what the engine's mask builder must produce): query token j of segment s
    may read every history slot of s, plus new token k of s when k <= j (causal) or k is j or
    an ancestor of j (tree). ``allowed_slots`` is the test oracle of that rule.
    """

    request_ids: list[int]
    kinds: list[str]
    positions: list[int]
    slot_mapping: list[int]
    cu_seqlens_q: list[int]
    history_lens: list[int]
    kv_slots: list[list[int]]
    tree_parents: list[tuple[int, ...] | None]

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens_q[-1]

    @property
    def num_segments(self) -> int:
        return len(self.request_ids)

    def allowed_slots(self, token_index: int) -> list[int]:
        """Physical slots packed token ``token_index`` may attend to (the oracle's mask row,
        from the parents by a walk to the root, independent of ``step_inputs``)."""
        if not 0 <= token_index < self.num_tokens:
            raise ValueError(f'token_index: must be in [0, {self.num_tokens}), '
                             f'got {token_index}')
        s = bisect_right(self.cu_seqlens_q, token_index) - 1
        history_len = self.history_lens[s]
        node = token_index - self.cu_seqlens_q[s]
        new_slots = self.kv_slots[s][history_len:]
        parents = self.tree_parents[s]
        if parents is None:
            visible = list(range(node + 1))
        else:
            visible = []
            while node != NO_PARENT:
                visible.append(node)
                node = parents[node]
            visible.reverse()
        return self.kv_slots[s][:history_len] + [new_slots[k] for k in visible]


def plan_step(ring: KVRing, segments: Sequence[SegmentSpec]) -> StepPlan:
    """Lay ``segments`` end to end and resolve their logical indices to ring slots.

    Every request must own a span in ``ring`` long enough for history_len + num_tokens slots
    and may appear at most once per step.
    """
    segments = list(segments)
    request_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    cu_seqlens_q = [0]
    kv_slots: list[list[int]] = []
    for segment in segments:
        if segment.request_id in request_ids:
            raise ValueError(f'segments: request {segment.request_id} appears twice in one step')
        span = ring.span(segment.request_id)
        num_used = segment.history_len + segment.num_tokens
        if num_used > span.length:
            raise ValueError(f'segments: request {segment.request_id} needs {num_used} slots '
                             f'(history_len {segment.history_len} + num_tokens '
                             f'{segment.num_tokens}) but owns {span.length}')
        request_ids.append(segment.request_id)
        positions.extend(segment.history_len + d for d in segment.depths())
        slot_mapping.extend(span.slots(segment.history_len, segment.num_tokens))
        cu_seqlens_q.append(cu_seqlens_q[-1] + segment.num_tokens)
        kv_slots.append(span.slots(0, num_used))
    return StepPlan(
        request_ids=request_ids,
        kinds=[segment.kind for segment in segments],
        positions=positions,
        slot_mapping=slot_mapping,
        cu_seqlens_q=cu_seqlens_q,
        history_lens=[segment.history_len for segment in segments],
        kv_slots=kv_slots,
        tree_parents=[segment.parents for segment in segments],
    )
