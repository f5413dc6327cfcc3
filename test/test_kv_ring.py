"""KV ring slot bookkeeping and the packed-step index plan (pure Python, no torch).

Expected values come from hand computation or from a brute-force occupancy model (one owner
per slot), never from the code under test.
"""
import random

import pytest

from vla_spec_ros.engine.scheduling.kv_ring import KVRing, RingSpan
from step_plan import NO_PARENT, SegmentSpec, plan_step

from helpers import can_allocate, live_spans


# ---------------------------------------------------------------- RingSpan

def test_span_slots_wrap_around_the_end():
    span = RingSpan(start=8, length=5, capacity=10)
    assert [span.slot(i) for i in range(5)] == [8, 9, 0, 1, 2]
    assert span.slots() == [8, 9, 0, 1, 2]
    assert span.slots(3, 2) == [1, 2]
    assert span.end == 3
    assert span.is_wrapped
    assert not RingSpan(0, 10, 10).is_wrapped
    assert {s for s in range(10) if span.contains(s)} == {8, 9, 0, 1, 2}
    assert not span.contains(10) and not span.contains(-1)


def test_span_full_ring_contains_everything():
    span = RingSpan(start=3, length=7, capacity=7)
    assert span.end == 3
    assert sorted(span.slots()) == list(range(7))
    assert all(span.contains(s) for s in range(7))


@pytest.mark.parametrize('kwargs, field', [
    (dict(start=10, length=1, capacity=10), 'start'),
    (dict(start=-1, length=1, capacity=10), 'start'),
    (dict(start=0, length=0, capacity=10), 'length'),
    (dict(start=0, length=11, capacity=10), 'length'),
    (dict(start=0, length=1, capacity=0), 'capacity'),
])
def test_span_rejects_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RingSpan(**kwargs)


def test_span_rejects_out_of_range_logical_index():
    span = RingSpan(2, 3, 10)
    with pytest.raises(ValueError, match='logical_index'):
        span.slot(3)
    with pytest.raises(ValueError, match='logical_index'):
        span.slot(-1)
    with pytest.raises(ValueError, match='outside the span'):
        span.slots(2, 2)


# ---------------------------------------------------------------- KVRing, hand-computed cases

def test_allocations_follow_ring_order_with_different_lengths():
    ring = KVRing(20)
    assert ring.allocate(1, 5) == RingSpan(0, 5, 20)
    assert ring.allocate(2, 7) == RingSpan(5, 7, 20)
    assert ring.allocate(3, 6) == RingSpan(12, 6, 20)
    assert ring.num_free == 2
    assert ring.allocate(4, 3) is None          # 2 free slots: no room, not an error
    assert ring.slots(2, 0, 7) == list(range(5, 12))
    assert ring.slot(3, 5) == 17
    assert list(live_spans(ring, range(5))) == [1, 2, 3]


def test_fifo_release_reuses_slots_and_wraps():
    ring = KVRing(10)
    ring.allocate(1, 4)                          # slots 0..3
    ring.allocate(2, 4)                          # slots 4..7
    ring.release(1)
    span = ring.allocate(3, 5)                   # 8, 9 then 0, 1, 2
    assert span == RingSpan(8, 5, 10)
    assert ring.slots(3, 0, 5) == [8, 9, 0, 1, 2]
    assert ring.num_free == 1
    ring.release(2)
    span = ring.allocate(4, 5)                   # next free run after slot 2: 3..7
    assert span.slots() == [3, 4, 5, 6, 7]


def test_out_of_order_release_is_reclaimed_at_once():
    ring = KVRing(12)
    for request_id in (1, 2, 3):
        ring.allocate(request_id, 4)             # [0,4) [4,8) [8,12)
    ring.release(2)                              # the middle one finishes first
    assert ring.num_free == 4
    assert ring.allocate(4, 5) is None           # only a 4-slot hole exists
    assert ring.allocate(4, 4) == RingSpan(4, 4, 12)
    ring.release(3)
    ring.release(1)                              # [8,12) and [0,4) merge across the end
    span = ring.allocate(5, 8)
    assert span.slots() == [8, 9, 10, 11, 0, 1, 2, 3]
    assert ring.num_free == 0


def test_next_fit_prefers_the_free_run_after_the_last_allocation():
    ring = KVRing(12)
    for request_id in (1, 2, 3):
        ring.allocate(request_id, 4)
    ring.release(1)                              # hole [0,4)
    ring.release(2)                              # hole [0,8): cursor is at 0 (end of 3)
    assert ring.allocate(4, 3).start == 0
    assert ring.allocate(5, 3).start == 3        # cursor 3; [3,8) fits
    ring.release(4)                              # holes [0,3) and [6,8); cursor at 6
    assert ring.allocate(6, 3).start == 0        # [6,8) too short: scan wraps to 0


def test_empty_ring_takes_any_size_at_the_cursor():
    ring = KVRing(10)
    ring.allocate(1, 7)
    ring.release(1)
    span = ring.allocate(2, 10)                  # empty ring: the full ring from slot 7
    assert span.slots() == [7, 8, 9, 0, 1, 2, 3, 4, 5, 6]
    assert ring.allocate(3, 1) is None


def test_ring_rejects_bad_input():
    with pytest.raises(ValueError, match='capacity'):
        KVRing(0)
    ring = KVRing(8)
    with pytest.raises(ValueError, match='num_slots'):
        ring.allocate(1, 0)
    with pytest.raises(ValueError, match='num_slots: 9 .* capacity 8'):
        ring.allocate(1, 9)
    ring.allocate(1, 2)
    with pytest.raises(ValueError, match='already owns'):
        ring.allocate(1, 2)
    with pytest.raises(ValueError, match='request_id'):
        ring.release(2)
    with pytest.raises(ValueError, match='request_id'):
        ring.slot(2, 0)
    with pytest.raises(ValueError, match='logical_index'):
        ring.slot(1, 2)
    assert 1 in ring and 2 not in ring


# ---------------------------------------------------------------- KVRing, randomized property

class OccupancyModel:
    """Brute force: one owner per slot; the documented next-fit rule by exhaustive scan."""

    def __init__(self, capacity):
        self.owner = [None] * capacity
        self.cursor = 0

    def first_fit_from_cursor(self, num_slots):
        capacity = len(self.owner)
        for distance in range(capacity):
            start = (self.cursor + distance) % capacity
            if all(self.owner[(start + i) % capacity] is None for i in range(num_slots)):
                return start
        return None


@pytest.mark.parametrize('seed', range(12))
def test_random_allocate_release_matches_brute_force(seed):
    rng = random.Random(seed)
    capacity = rng.randint(1, 64)
    ring = KVRing(capacity)
    model = OccupancyModel(capacity)
    live = []
    next_id = 0
    for _ in range(400):
        if live and rng.random() < 0.45:
            request_id = live.pop(rng.randrange(len(live)))     # any release order
            ring.release(request_id)
            model.owner = [None if o == request_id else o for o in model.owner]
        else:
            num_slots = rng.randint(1, capacity)
            expected_start = model.first_fit_from_cursor(num_slots)
            assert can_allocate(ring, live, num_slots) == (expected_start is not None)
            span = ring.allocate(next_id, num_slots)
            if expected_start is None:
                assert span is None
            else:
                assert span.start == expected_start and span.length == num_slots
                for i in range(num_slots):
                    slot = (expected_start + i) % capacity
                    assert model.owner[slot] is None                # never overlaps
                    model.owner[slot] = next_id
                    assert ring.slot(next_id, i) == slot
                model.cursor = (expected_start + num_slots) % capacity
                live.append(next_id)
            next_id += 1
        assert ring.num_free == model.owner.count(None)
        owned = {}
        for request_id, span in live_spans(ring, range(next_id)).items():
            for slot in span.slots():
                assert slot not in owned                            # live spans are disjoint
                owned[slot] = request_id
        assert owned == {s: o for s, o in enumerate(model.owner) if o is not None}
        assert sorted(live_spans(ring, range(next_id))) == sorted(live)


# ---------------------------------------------------------------- step plan

def _packed_ring():
    """Capacity 16: request 1 owns [12,16)+[0,4), request 2 owns [4,9), request 3 [9,12)."""
    ring = KVRing(16)
    ring.allocate(0, 12)                         # [0,12) to move the cursor
    ring.release(0)
    ring.allocate(1, 8)                          # 12..15, 0..3
    ring.allocate(2, 5)                          # 4..8
    ring.allocate(3, 3)                          # 9..11
    return ring


def test_plan_hand_computed():
    ring = _packed_ring()
    segments = [
        SegmentSpec(request_id=2, history_len=0, num_tokens=3, kind='prefill'),
        SegmentSpec(request_id=1, history_len=5, num_tokens=1, kind='tree',
                    parents=(NO_PARENT,)),                 # a decode token
        SegmentSpec(request_id=3, history_len=0, num_tokens=3, kind='tree',
                    parents=(NO_PARENT, 0, 0)),
    ]
    plan = plan_step(ring, segments)
    assert plan.request_ids == [2, 1, 3]
    assert plan.kinds == ['prefill', 'tree', 'tree']
    assert plan.positions == [0, 1, 2, 5, 0, 1, 1]
    assert plan.slot_mapping == [4, 5, 6, 1, 9, 10, 11]
    assert plan.cu_seqlens_q == [0, 3, 4, 7]
    assert plan.history_lens == [0, 5, 0]
    assert plan.kv_slots == [[4, 5, 6], [12, 13, 14, 15, 0, 1], [9, 10, 11]]
    assert plan.num_tokens == 7 and plan.num_segments == 3
    assert plan.tree_parents == [None, (NO_PARENT,), (NO_PARENT, 0, 0)]
    rows = [plan.allowed_slots(t) for t in range(7)]
    assert rows == [[4], [4, 5], [4, 5, 6],                   # causal prefill
                    [12, 13, 14, 15, 0, 1],                    # decode: history + itself
                    [9], [9, 10], [9, 11]]                     # siblings do not see each other


def test_plan_tree_on_history_with_wrapped_span():
    ring = _packed_ring()
    # Request 1: 3 entries of history (slots 12..14), then a tree root->a->b, root->c.
    segment = SegmentSpec(1, history_len=3, num_tokens=4, kind='tree',
                          parents=(NO_PARENT, 0, 1, 0))
    plan = plan_step(ring, [segment])
    assert plan.positions == [3, 4, 5, 4]                      # history_len + depth
    assert plan.slot_mapping == [15, 0, 1, 2]                  # logical 3..6, wrapping
    assert [plan.allowed_slots(t) for t in range(4)] == [
        [12, 13, 14, 15], [12, 13, 14, 15, 0], [12, 13, 14, 15, 0, 1], [12, 13, 14, 15, 2]]


def _ancestor_closure(parents):
    """visible[j][k]: k is j or an ancestor of j, by transitive closure (not a parent walk)."""
    n = len(parents)
    visible = [[j == k or parents[j] == k for k in range(n)] for j in range(n)]
    for mid in range(n):
        for j in range(n):
            if visible[j][mid]:
                for k in range(n):
                    visible[j][k] = visible[j][k] or visible[mid][k]
    return visible


@pytest.mark.parametrize('seed', range(8))
def test_random_plan_mask_matches_occupancy_model(seed):
    rng = random.Random(100 + seed)
    capacity = rng.randint(40, 120)
    ring = KVRing(capacity)
    owner = {}                                   # physical slot -> (request_id, logical index)
    segments = []
    for request_id in range(rng.randint(1, 6)):
        num_slots = rng.randint(2, capacity // 6)
        span = ring.allocate(request_id, num_slots)
        if rng.random() < 0.5:                   # churn so that spans start anywhere
            ring.release(request_id)
            span = ring.allocate(request_id, num_slots)
        for i in range(num_slots):
            owner[(span.start + i) % capacity] = (request_id, i)
        history_len = rng.randint(0, num_slots - 1)
        num_tokens = rng.randint(1, num_slots - history_len)
        kind = rng.choice(['prefill', 'tree'])
        parents = None
        if kind == 'tree':
            parents = (NO_PARENT,) + tuple(rng.randrange(i) for i in range(1, num_tokens))
        segments.append(SegmentSpec(request_id, history_len, num_tokens, kind, parents))
    rng.shuffle(segments)
    plan = plan_step(ring, segments)

    assert len(set(plan.slot_mapping)) == plan.num_tokens     # no two writes to one slot
    token = 0
    for s, segment in enumerate(segments):
        assert plan.cu_seqlens_q[s] == token
        closure = None if segment.parents is None else _ancestor_closure(segment.parents)
        for j in range(segment.num_tokens):
            written = plan.slot_mapping[token]
            assert owner[written] == (segment.request_id, segment.history_len + j)
            if closure is None:
                assert plan.positions[token] == segment.history_len + j
                visible_new = set(range(j + 1))
            else:
                depth = sum(closure[j]) - 1                     # ancestors of j
                assert plan.positions[token] == segment.history_len + depth
                visible_new = {k for k in range(segment.num_tokens) if closure[j][k]}
            expected = {slot for slot, (rid, i) in owner.items()
                        if rid == segment.request_id and (
                            i < segment.history_len
                            or (i - segment.history_len) in visible_new)}
            row = plan.allowed_slots(token)
            assert len(row) == len(set(row)) and set(row) == expected
            token += 1
        assert plan.kv_slots[s][segment.history_len:] == \
            plan.slot_mapping[plan.cu_seqlens_q[s]:plan.cu_seqlens_q[s + 1]]
        assert [owner[slot] for slot in plan.kv_slots[s]] == \
            [(segment.request_id, i)
             for i in range(segment.history_len + segment.num_tokens)]
    assert plan.num_tokens == token


def test_empty_plan():
    plan = plan_step(KVRing(4), [])
    assert plan.cu_seqlens_q == [0] and plan.num_tokens == 0 and plan.num_segments == 0


@pytest.mark.parametrize('kwargs, match', [
    (dict(request_id=1, history_len=0, num_tokens=1, kind='verify'), 'kind'),
    (dict(request_id=1, history_len=-1, num_tokens=1, kind='prefill'), 'history_len'),
    (dict(request_id=1, history_len=0, num_tokens=0, kind='prefill'), 'num_tokens'),
    (dict(request_id=1, history_len=0, num_tokens=2, kind='prefill', parents=(-1, 0)),
     'parents'),
    (dict(request_id=1, history_len=0, num_tokens=2, kind='tree'), 'parents'),
    (dict(request_id=1, history_len=0, num_tokens=2, kind='tree', parents=(-1,)), 'parents'),
    (dict(request_id=1, history_len=0, num_tokens=2, kind='tree', parents=(0, 0)), 'parents'),
    (dict(request_id=1, history_len=0, num_tokens=3, kind='tree', parents=(-1, 2, 0)),
     'parents'),
])
def test_segment_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SegmentSpec(**kwargs)


def test_plan_rejects_inconsistent_steps():
    ring = _packed_ring()
    with pytest.raises(ValueError, match='appears twice'):
        plan_step(ring, [SegmentSpec(2, 0, 1, 'prefill'),
                         SegmentSpec(2, 1, 1, 'tree', (NO_PARENT,))])
    with pytest.raises(ValueError, match='needs 6 slots .* owns 5'):
        plan_step(ring, [SegmentSpec(2, 4, 2, 'tree', (NO_PARENT, 0))])
    with pytest.raises(ValueError, match='request_id'):
        plan_step(ring, [SegmentSpec(7, 0, 1, 'prefill')])
    with pytest.raises(ValueError, match='token_index'):
        plan_step(ring, [SegmentSpec(2, 0, 1, 'prefill')]).allowed_slots(1)
