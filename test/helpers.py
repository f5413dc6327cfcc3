"""Views of engine state that only tests need, computed from the engine's public state.

The engine keeps no method that only a test calls: these functions give the tests what such
methods gave them (tree masks and leaf paths, live ring spans, in-flight and held requests),
from the public fields and queries of ``DraftTree``, ``KVRing``, ``Scheduler`` and
``HostStep``.
"""
from typing import Iterable

from vla_spec_ros.engine.drafting.draft_tree import DraftTree
from vla_spec_ros.engine.scheduling.kv_ring import KVRing, RingSpan
from vla_spec_ros.engine.scheduling.scheduler import Scheduler
from vla_spec_ros.engine.device.step_inputs import HostStep, ancestor_mask


# ---- draft trees ----------------------------------------------------------------------------

def sharpen_draft_head(head, factor: float = 30.0):
    """Peak a random draft head's distributions (its last projection scaled up), in place, so
    that confidence pruning has sure and unsure candidates to tell apart: a plain random head
    spreads its probability over the whole vocabulary. Returns ``head``."""
    import torch
    with torch.no_grad():
        head.layers[-1].mlp.down_proj.weight.mul_(factor)
    return head


def tree_mask(tree: DraftTree) -> list[list[bool]]:
    """(num_nodes, num_nodes): [i][j] is True iff node j is node i or an ancestor of it (the
    engine's one tree-mask builder, ``step_inputs.ancestor_mask``)."""
    return ancestor_mask(tree.parents).tolist()


def root_to_leaf_paths(tree: DraftTree) -> list[list[int]]:
    """One root-to-leaf node-index path per leaf, leaves in increasing index order."""
    return [tree.path_to(i) for i in range(tree.num_nodes) if not tree.children(i)]


# ---- KV ring --------------------------------------------------------------------------------

def live_spans(ring: KVRing, request_ids: Iterable[int]) -> dict[int, RingSpan]:
    """request_id -> span of every id in ``request_ids`` that owns one, in the given order."""
    return {request_id: ring.span(request_id) for request_id in request_ids
            if request_id in ring}


def can_allocate(ring: KVRing, request_ids: Iterable[int], num_slots: int) -> bool:
    """True when ``num_slots`` consecutive slots (modulo the capacity) are free, i.e. when
    ``ring.allocate(..., num_slots)`` would succeed now; ``request_ids`` must include every
    request that owns a span."""
    spans = live_spans(ring, request_ids)
    assert sum(span.length for span in spans.values()) == ring.capacity - ring.num_free, \
        'request_ids misses a live span'
    used = {slot for span in spans.values() for slot in span.slots()}
    free = [slot not in used for slot in range(ring.capacity)]
    run = 0
    for is_free in free + free:         # twice round: a free run may wrap past the end
        run = run + 1 if is_free else 0
        if run >= num_slots:
            return True
    return False


# ---- scheduler ------------------------------------------------------------------------------

def inflight_ids(scheduler: Scheduler, request_ids: Iterable[int]) -> list[int]:
    """The ids among ``request_ids`` in flight, in admission order (= id order: admission is
    FIFO). A request owns a ring span exactly while it is in flight (the scheduler is the
    ring's only allocator)."""
    return sorted(live_spans(scheduler.ring, request_ids))


def num_held(scheduler: Scheduler, num_submitted: int, num_gone: int) -> int:
    """Finished requests held for per-stream order: of ``num_submitted`` requests, those not
    yet emitted or dropped (``num_gone``) that neither wait nor are in flight."""
    return num_submitted - num_gone - scheduler.num_waiting - scheduler.num_inflight


# ---- packed steps ---------------------------------------------------------------------------

def reference_allowed_slots(step: HostStep, row: int) -> list[int]:
    """Physical slots packed row ``row`` may read (plain loops over the packed arrays)."""
    lp = step.num_prefill
    if row < lp:
        start = 0
        for block in step.prefill_blocks:           # causal within its own prefill block
            if row < start + block:
                return [int(s) for s in step.slot_mapping[start:row + 1]]
            start += block
    s, j = divmod(row - lp, step.num_rows)
    return [int(step.kv_index[s, c]) for c in range(step.kv_index.shape[1])
            if step.mask[s, j, c]]


# ---- one request at a time through a drafter's batched interface (engine/drafting/drafter.py)

def _row_range(features) -> range:
    """Rows 0..n-1 of a features tensor (none for drafters that ignore features)."""
    return range(0 if features is None else features.shape[0])


def begin_one(drafter, request_id, prefix_embeds, prefix_features, root_token, stream_id=''):
    """``update`` with one new prompt: its embeddings, its verifier features, its root."""
    from vla_spec_ros.engine.drafting.drafter import DraftBegin
    drafter.update([DraftBegin(request_id, prefix_embeds, _row_range(prefix_features),
                               root_token, stream_id)], [], prefix_features)


def advance_one(drafter, request_id, path_tokens, path_features, bonus):
    """``update`` with one accepted path and the verifier's features at its nodes."""
    from vla_spec_ros.engine.drafting.drafter import DraftAdvance
    drafter.update([], [DraftAdvance(request_id, path_tokens, _row_range(path_features),
                                     bonus)], path_features)


def propose_one(drafter, request_id, depth, top_k, max_nodes, min_prob=0.0):
    """The tree ``propose_batch`` gives one request."""
    return drafter.propose_batch([request_id], [depth], top_k, max_nodes, min_prob)[0]


def serve_streams(engine, frames) -> list:
    """A camera per stream that always has a frame ready: offer each stream's next frame as
    soon as none of it waits; every result must be error-free. Returns them in emit order."""
    pending, out = list(frames), []
    while pending or engine.has_work():
        while pending and pending[0].stream_id not in engine.waiting_streams:
            engine.submit(pending.pop(0))
        for fin in engine.step():
            assert fin.error is None, fin.error
            out.append(fin)
    return out
