"""Cross-request pipelining scheduler (pure Python, no torch): S2 timing and order, S6.

Expected timelines are derived by hand (closed forms) or by a small independent simulation
that only knows the contracts: FIFO admission, at most max_prefills prefills per step,
max_inflight, one token per step with plain decoding, per-stream emission order.
"""
import ast
import pathlib
import random

import pytest

from vla_spec_ros.engine.scheduling.kv_ring import KVRing
from vla_spec_ros.engine.scheduling.request import Request
from vla_spec_ros.engine.scheduling.scheduler import ScheduledStep, Scheduler

from helpers import can_allocate, inflight_ids, live_spans, num_held

ACTION_DIM = 7


def ids(requests):
    return [r.request_id for r in requests]


def make_request(request_id, stream_id='cam0', prefix_len=20, scratch=0):
    return Request(request_id=request_id, stream_id=stream_id, prefix_len=prefix_len,
                   num_tokens_needed=ACTION_DIM, num_slots=prefix_len + ACTION_DIM + scratch)


def prefix_len_of(i):
    """Varying instruction lengths (different prompts per frame)."""
    return 15 + (i * 7) % 13


class Driver:
    """Runs the engine loop (submit arrivals, schedule, report tokens, pop) and records it."""

    def __init__(self, scheduler, gain=None):
        self.scheduler = scheduler
        self.gain = gain or (lambda request_id, remaining: 1)   # plain decoding: 1 per step
        self.step = 0
        self.prefill_step = {}
        self.emit_step = {}
        self.emitted = []                                       # in emission order
        self.steps = []

    def run_step(self, arrivals=()):
        for request in arrivals:
            self.scheduler.submit(request)
        scheduled = self.scheduler.schedule()
        self.steps.append(scheduled)
        assert len(scheduled.decode_ids) + len(scheduled.prefills) \
            <= self.scheduler.max_inflight
        assert len(scheduled.prefills) <= self.scheduler.max_prefills
        # In admission order (of the requests this driver admitted; a test may admit some
        # before handing the scheduler over).
        known = [i for i in scheduled.decode_ids if i in self.prefill_step]
        assert known == [i for i in self.prefill_step if i in set(known)]
        advancing = list(scheduled.decode)
        for request in scheduled.prefills:
            self.prefill_step[request.request_id] = self.step   # insertion = admission order
            advancing.append(request)
        for request in advancing:
            gain = self.gain(request.request_id, request.num_remaining)
            self.scheduler.on_tokens(request.request_id, [0] * gain)
        for request_id in ids(self.scheduler.pop_finished()):
            self.emit_step[request_id] = self.step
            self.emitted.append(request_id)
        self.step += 1
        return scheduled

    def run(self, arrivals_by_step, max_steps=10_000):
        last_arrival = max(arrivals_by_step, default=-1)
        while self.step <= last_arrival or self.scheduler.has_work():
            assert self.step < max_steps, 'the scheduler stopped making progress'
            self.run_step(arrivals_by_step.get(self.step, ()))
        assert ids(self.scheduler.pop_finished()) == []


def expected_plain_timeline(arrival_steps, max_inflight, action_dim=ACTION_DIM):
    """Independent closed-form simulation for plain decoding with a ring that never fills.

    Frame i (FIFO) is prefilled at the first step t >= its arrival, after the previous
    prefill, at which fewer than max_inflight earlier frames are still running (a frame
    prefilled at p runs in steps p .. p + action_dim - 1); it is emitted in step
    p + action_dim - 1.
    """
    prefill = []
    for i, arrival in enumerate(arrival_steps):
        t = max(arrival, prefill[-1] + 1 if prefill else 0)
        while sum(1 for p in prefill if t - action_dim + 1 <= p <= t - 1) >= max_inflight:
            t += 1
        prefill.append(t)
    return prefill, [p + action_dim - 1 for p in prefill]


def big_ring():
    return KVRing(64 * (max(prefix_len_of(i) for i in range(13)) + ACTION_DIM))


# ---------------------------------------------------------------- S2 timeline

@pytest.mark.parametrize('max_inflight', [7, 1, 3])
def test_s2_timeline_one_frame_per_step(max_inflight):
    num_frames = 24
    requests = [make_request(i, prefix_len=prefix_len_of(i)) for i in range(num_frames)]
    driver = Driver(Scheduler(max_inflight, ACTION_DIM, big_ring()))
    driver.run({i: [requests[i]] for i in range(num_frames)})

    if max_inflight == 7:                        # full pipeline: one prefill every step
        expected_prefill = list(range(num_frames))
    elif max_inflight == 1:                      # plain AR: prefill, 6 decode-only steps, ...
        expected_prefill = [ACTION_DIM * i for i in range(num_frames)]
    else:                                        # 3 in flight, then 4 steps until one frees
        expected_prefill = [ACTION_DIM * (i // 3) + i % 3 for i in range(num_frames)]
    assert [driver.prefill_step[i] for i in range(num_frames)] == expected_prefill
    for i in range(num_frames):                  # each frame occupies exactly action_dim steps
        assert driver.emit_step[i] - driver.prefill_step[i] + 1 == ACTION_DIM
    assert driver.emitted == list(range(num_frames))
    if max_inflight == 7:                        # steady state: prefill + 6 decodes per step
        assert all(len(s.decode_ids) == 6 and len(s.prefills) == 1
                   for s in driver.steps[6:num_frames])
    if max_inflight == 1:
        for step, scheduled in enumerate(driver.steps):
            is_prefill_step = step % ACTION_DIM == 0
            assert len(scheduled.prefills) == is_prefill_step
            assert len(scheduled.decode_ids) == (0 if is_prefill_step else 1)


def test_irregular_arrivals_force_decode_only_steps():
    arrivals = [0, 1, 2, 3, 4, 5, 12, 13, 30, 31, 31, 31, 32, 45, 46, 47, 48, 49, 50, 51, 70]
    for max_inflight in (1, 2, 3, 7):
        requests = [make_request(i, prefix_len=prefix_len_of(i)) for i in range(len(arrivals))]
        by_step = {}
        for request, step in zip(requests, arrivals):
            by_step.setdefault(step, []).append(request)
        driver = Driver(Scheduler(max_inflight, ACTION_DIM, big_ring()))
        driver.run(by_step)
        prefill, emit = expected_plain_timeline(arrivals, max_inflight)
        assert [driver.prefill_step[i] for i in range(len(arrivals))] == prefill
        assert [driver.emit_step[i] for i in range(len(arrivals))] == emit
        assert driver.emitted == list(range(len(arrivals)))
        # Gaps: steps with nothing to prefill still advance every in-flight frame (S6).
        num_decode_only = sum(1 for s in driver.steps if not s.prefills and s.decode_ids)
        assert num_decode_only > 0
        # After the last arrival the pipeline drains within action_dim steps of the last prefill.
        assert driver.step == prefill[-1] + ACTION_DIM


def test_nothing_scheduled_when_idle():
    scheduler = Scheduler(4, ACTION_DIM, KVRing(100))
    assert not scheduler.has_work()
    step = scheduler.schedule()
    assert step == ScheduledStep(prefills=[], decode=[]) and step.is_empty


# ---------------------------------------------------------------- ring-limited admission

def test_prefill_waits_for_ring_room_in_fifo_order():
    # 13 slots per request, capacity 30: only two requests fit at a time.
    ring = KVRing(30)
    driver = Driver(Scheduler(7, ACTION_DIM, ring))
    requests = [make_request(i, prefix_len=6) for i in range(8)]
    driver.run({i: [requests[i]] for i in range(8)})
    # Frame i waits for frame i - 2 to finish (released after its step p + 6).
    assert [driver.prefill_step[i] for i in range(8)] == \
        [ACTION_DIM * (i // 2) + i % 2 for i in range(8)]
    assert driver.emitted == list(range(8))
    assert ring.num_free == 30 and ring.num_live == 0


def test_large_prompt_is_not_bypassed_by_smaller_ones():
    ring = KVRing(40)
    scheduler = Scheduler(7, ACTION_DIM, ring)
    scheduler.submit(make_request(0, prefix_len=20))            # 27 slots
    scheduler.submit(make_request(1, prefix_len=30))            # 37 slots: must wait
    scheduler.submit(make_request(2, prefix_len=3))             # 10 slots: would fit
    driver = Driver(scheduler)
    driver.run({})
    assert driver.prefill_step == {0: 0, 1: 7, 2: 14}
    assert driver.emitted == [0, 1, 2]


# ---------------------------------------------------------------- streams and speculation

@pytest.mark.parametrize('cap', [1, 2, 3])
def test_one_stream_at_its_cap_is_a_pipeline_of_that_depth(cap):
    """max_inflight_per_stream bounds one camera's frames in flight below max_inflight: the
    timeline is the closed form with max_inflight = the cap."""
    num_frames = 20
    requests = [make_request(i, prefix_len=prefix_len_of(i)) for i in range(num_frames)]
    driver = Driver(Scheduler(7, ACTION_DIM, big_ring(), max_inflight_per_stream=cap))
    driver.run({i: [requests[i]] for i in range(num_frames)})
    prefill, emit = expected_plain_timeline(range(num_frames), cap)
    assert [driver.prefill_step[i] for i in range(num_frames)] == prefill
    assert [driver.emit_step[i] for i in range(num_frames)] == emit
    assert max(len(s.decode_ids) + len(s.prefills) for s in driver.steps) == cap


def test_a_stream_at_its_cap_is_passed_over_and_keeps_its_place():
    """Stream a has its two frames in flight; its third waits at the head of the queue while
    b's frame behind it is admitted. When a frame of a finishes, a's waiting frame goes first
    again (it kept its place)."""
    scheduler = Scheduler(7, ACTION_DIM, big_ring(), max_inflight_per_stream=2)
    for i in range(2):
        scheduler.submit(make_request(i, 'a'))
        assert ids(scheduler.schedule().prefills) == [i]
    scheduler.submit(make_request(2, 'a'))
    scheduler.submit(make_request(3, 'b'))
    scheduler.submit(make_request(4, 'b'))
    step = scheduler.schedule()
    assert ids(step.prefills) == [3] and step.decode_ids == [0, 1]
    assert scheduler.waiting_streams == {'a', 'b'}
    scheduler.on_tokens(0, [0] * ACTION_DIM)           # a's first frame finishes
    step = scheduler.schedule()
    assert ids(step.prefills) == [2]                  # a's frame kept the head of the queue
    step = scheduler.schedule()
    assert ids(step.prefills) == [4]                  # b is under its cap (3 in flight)


@pytest.mark.parametrize('seed', range(6))
def test_random_streams_under_a_per_stream_cap(seed):
    """Random arrivals of up to three streams with plain decoding: a stream never has more
    than its cap in flight, the total never exceeds max_inflight, a waiting frame is passed
    over only while its stream is at its cap (or its stream's earlier frame waits), every
    frame is emitted, in order per stream."""
    rng = random.Random(seed)
    max_inflight, cap = rng.randint(2, 7), rng.randint(1, 3)
    streams = ['s%d' % k for k in range(rng.randint(1, 3))]
    arrivals, step, stream_of = {}, 0, {}
    for i in range(40):
        step += rng.choice([0, 0, 1, 2, 4])
        stream_of[i] = rng.choice(streams)
        arrivals.setdefault(step, []).append(make_request(i, stream_of[i], rng.randint(3, 30)))
    scheduler = Scheduler(max_inflight, ACTION_DIM, big_ring(), max_inflight_per_stream=cap)
    driver = Driver(scheduler)
    waiting = []                                       # the reference queue, by arrival
    while driver.step <= max(arrivals) or scheduler.has_work():
        assert driver.step < 5000
        arriving = arrivals.get(driver.step, ())
        waiting += [r.request_id for r in arriving]
        inflight_before = {i for i in driver.prefill_step if i not in driver.emit_step}
        scheduled = driver.run_step(arriving)
        admitted = ids(scheduled.prefills)
        counts = {}
        for i in inflight_before:
            counts[stream_of[i]] = counts.get(stream_of[i], 0) + 1
        # the reference admission: the first waiting frame whose stream is under its cap
        expected = []
        for i in list(waiting):
            if len(inflight_before) + len(expected) >= max_inflight or expected:
                break                                   # one prefill per step here
            if counts.get(stream_of[i], 0) < cap:
                expected.append(i)
        assert admitted == expected
        for i in admitted:
            waiting.remove(i)
        inflight = [i for i in driver.prefill_step if i not in driver.emit_step]
        assert len(inflight) <= max_inflight
        for stream in streams:
            assert sum(stream_of[i] == stream for i in inflight) <= cap
    assert sorted(driver.emitted) == list(range(40))
    for stream in streams:
        order = [i for i in driver.emitted if stream_of[i] == stream]
        assert order == sorted(order)


def test_two_interleaved_streams_plain():
    arrivals = {}
    streams = {}
    for i in range(22):
        stream_id = 'left' if i % 2 == 0 else 'right'
        streams[i] = stream_id
        arrivals[i // 2 * 3 + i % 2] = [make_request(i, stream_id, prefix_len_of(i))]
    driver = Driver(Scheduler(4, ACTION_DIM, big_ring()))
    driver.run(arrivals)
    prefill, emit = expected_plain_timeline(sorted(arrivals), 4)
    assert [driver.prefill_step[i] for i in range(22)] == prefill
    assert [driver.emit_step[i] for i in range(22)] == emit
    for stream_id in ('left', 'right'):
        order = [i for i in driver.emitted if streams[i] == stream_id]
        assert order == sorted(order) and len(order) == 11


def test_speculative_out_of_order_finish_is_held_per_stream():
    scheduler = Scheduler(7, ACTION_DIM, big_ring())
    scheduler.submit(make_request(0, 'a', scratch=10))
    scheduler.submit(make_request(1, 'a', scratch=10))
    scheduler.submit(make_request(2, 'b', scratch=10))
    # step 0: prefill 0
    assert ids(scheduler.schedule().prefills) == [0]
    scheduler.on_tokens(0, [0] * 1)
    assert ids(scheduler.pop_finished()) == []
    # step 1: prefill 1, frame 0 accepts a short path
    step = scheduler.schedule()
    assert ids(step.prefills) == [1] and step.decode_ids == [0]
    scheduler.on_tokens(0, [0] * 2)
    scheduler.on_tokens(1, [0] * 1)
    # step 2: prefill 2; frame 1 accepts everything and finishes before frame 0
    step = scheduler.schedule()
    assert ids(step.prefills) == [2] and step.decode_ids == [0, 1]
    scheduler.on_tokens(0, [0] * 1)
    assert scheduler.on_tokens(1, [0] * 6) is True
    scheduler.on_tokens(2, [0] * 1)
    assert ids(scheduler.pop_finished()) == []                        # held behind frame 0
    assert num_held(scheduler, 3, 0) == 1 and scheduler.num_inflight == 2
    # step 3: stream b finishes; it is independent of stream a
    step = scheduler.schedule()
    assert step.prefills == [] and step.decode_ids == [0, 2]
    scheduler.on_tokens(0, [0] * 2)                                     # frame 0 at 6 of 7
    scheduler.on_tokens(2, [0] * 6)
    assert ids(scheduler.pop_finished()) == [2]
    # step 4: frame 0 finishes and releases frame 1 right behind it
    step = scheduler.schedule()
    assert step.decode_ids == [0]
    scheduler.on_tokens(0, [0] * 1)
    assert ids(scheduler.pop_finished()) == [0, 1]
    assert not scheduler.has_work() and num_held(scheduler, 3, 3) == 0
    assert scheduler.ring.num_live == 0


@pytest.mark.parametrize('seed', range(10))
def test_random_streams_and_gains_keep_order_and_liveness(seed):
    rng = random.Random(seed)
    max_inflight = rng.randint(1, 6)
    max_prefills = rng.randint(1, max_inflight)
    stream_ids = ['s%d' % k for k in range(rng.randint(1, 3))]
    requests, arrivals = [], {}
    step = 0
    for i in range(rng.randint(10, 40)):
        step += rng.choice([0, 0, 1, 1, 1, 2, 5, 9])
        request = make_request(i, rng.choice(stream_ids), rng.randint(3, 40),
                               scratch=rng.randint(0, 12))
        requests.append(request)
        arrivals.setdefault(step, []).append(request)
    capacity = rng.randint(max(r.num_slots for r in requests), 200)
    ring = KVRing(capacity)
    scheduler = Scheduler(max_inflight, ACTION_DIM, ring, max_prefills)

    # The reference only sees token counts and finish events; it derives emission by itself.
    tokens = {}
    submitted_by_stream = {s: [] for s in stream_ids}
    finished, emitted_ref, waiting, prefill_step = set(), [], [], {}

    driver_step = 0
    last_arrival = max(arrivals)
    while driver_step <= last_arrival or scheduler.has_work():
        assert driver_step < 5000
        for request in arrivals.get(driver_step, ()):
            scheduler.submit(request)
            submitted_by_stream[request.stream_id].append(request.request_id)
            waiting.append(request.request_id)
        scheduled = scheduler.schedule()
        inflight_before = sorted(tokens)
        assert scheduled.decode_ids == inflight_before                # everyone advances (S6)
        assert len(scheduled.prefills) <= max_prefills
        for request in scheduled.prefills:
            assert request.request_id == waiting.pop(0)             # FIFO admission
            prefill_step[request.request_id] = driver_step
            tokens[request.request_id] = 0
        if waiting and len(scheduled.prefills) < max_prefills:
            # The head stays waiting only when the pipeline is full or the ring lacks room.
            head = requests[waiting[0]]
            assert len(tokens) == max_inflight or not can_allocate(ring, tokens,
                                                                   head.num_slots)
        assert len(tokens) <= max_inflight
        # No two in-flight requests share a slot; exactly the in-flight requests own spans.
        spans = live_spans(ring, range(len(requests)))
        assert sorted(spans) == sorted(tokens)
        used = [s for span in spans.values() for s in span.slots()]
        assert len(used) == len(set(used))

        finish_events = []
        for request_id in sorted(tokens):
            gain = rng.randint(1, ACTION_DIM - tokens[request_id])
            tokens[request_id] += gain
            is_done = scheduler.on_tokens(request_id, [0] * gain)
            assert is_done == (tokens[request_id] == ACTION_DIM)
            if is_done:
                finish_events.append(request_id)
        expected = []
        for request_id in finish_events:                 # emission rule, applied per event:
            finished.add(request_id)                     # a finish can only unblock its stream
            del tokens[request_id]
            queue = submitted_by_stream[requests[request_id].stream_id]
            while queue and queue[0] in finished:
                expected.append(queue.pop(0))
        emitted_ref += expected
        assert ids(scheduler.pop_finished()) == expected
        for request_id in expected:                      # S2 depth bound holds when held
            assert driver_step - prefill_step[request_id] + 1 <= ACTION_DIM
        driver_step += 1

    assert sorted(emitted_ref) == list(range(len(requests)))
    assert ring.num_free == capacity
    for stream_id in stream_ids:
        order = [i for i in emitted_ref if requests[i].stream_id == stream_id]
        assert order == sorted(order)


# ---------------------------------------------------------------- reset and drop_waiting

def test_reset_one_stream_frees_its_slots_and_keeps_the_other():
    ring = KVRing(500)
    scheduler = Scheduler(4, ACTION_DIM, ring)
    for i, stream_id in enumerate(['a', 'b', 'a', 'b', 'a', 'a']):
        scheduler.submit(make_request(i, stream_id, prefix_len=10 + i))
    for _ in range(3):                                   # admit 0, 1, 2 with a few tokens
        step = scheduler.schedule()
        for request_id in step.decode_ids + ids(step.prefills):
            scheduler.on_tokens(request_id, [0] * 1)
    assert inflight_ids(scheduler, range(6)) == [0, 1, 2] and scheduler.num_waiting == 3
    freed = sum(make_request(i, prefix_len=10 + i).num_slots for i in (0, 2))
    num_free_before = ring.num_free

    assert ids(scheduler.reset('a')) == [0, 2, 4, 5]
    assert ring.num_free == num_free_before + freed
    assert inflight_ids(scheduler, range(6)) == [1] and scheduler.num_waiting == 1
    emitted = []
    while scheduler.has_work():
        step = scheduler.schedule()
        for request_id in step.decode_ids + ids(step.prefills):
            scheduler.on_tokens(request_id, [0] * 1)
        emitted += ids(scheduler.pop_finished())
    assert emitted == [1, 3]
    assert ring.num_free == 500


def test_reset_all_drops_held_finished_requests_too():
    ring = KVRing(500)
    scheduler = Scheduler(4, ACTION_DIM, ring)
    scheduler.submit(make_request(0, 'a'))
    scheduler.submit(make_request(1, 'a'))
    scheduler.submit(make_request(2, 'b'))
    scheduler.schedule()
    scheduler.on_tokens(0, [0] * 1)
    scheduler.schedule()
    scheduler.on_tokens(0, [0] * 1)
    scheduler.on_tokens(1, [0] * ACTION_DIM)                   # finished, held behind 0
    assert ids(scheduler.pop_finished()) == [] and num_held(scheduler, 3, 0) == 1
    assert ids(scheduler.reset()) == [0, 1, 2]
    assert not scheduler.has_work() and num_held(scheduler, 3, 3) == 0
    assert ids(scheduler.pop_finished()) == [] and ring.num_free == 500
    scheduler.submit(make_request(3, 'a'))               # the stream starts afresh
    assert ids(scheduler.schedule().prefills) == [3]


def test_drop_waiting_replaces_queued_frames_of_one_stream():
    scheduler = Scheduler(1, ACTION_DIM, KVRing(500))
    scheduler.submit(make_request(0, 'a'))
    assert ids(scheduler.schedule().prefills) == [0]
    scheduler.on_tokens(0, [0] * 1)
    scheduler.submit(make_request(1, 'a'))
    scheduler.submit(make_request(2, 'b'))
    scheduler.submit(make_request(3, 'a'))
    assert ids(scheduler.drop_waiting('a')) == [1, 3]
    assert ids(scheduler.drop_waiting('c')) == []
    scheduler.submit(make_request(4, 'a'))               # the newer frame replaces them
    driver = Driver(scheduler)
    driver.run({})
    assert driver.emitted == [0, 2, 4]


def test_replace_waiting_keeps_the_stream_place_in_the_queue():
    """A stream whose waiting frame is replaced keeps its place: with one slot in flight and
    both cameras replacing their frames every period, a plain drop + append let the stream
    whose frame arrived just after the admission always go last (a robot starved)."""
    scheduler = Scheduler(1, ACTION_DIM, KVRing(500))
    scheduler.submit(make_request(0, 'a'))
    assert ids(scheduler.schedule().prefills) == [0]
    scheduler.submit(make_request(1, 'a'))          # a waits first, then b
    scheduler.submit(make_request(2, 'b'))
    assert ids(scheduler.replace_waiting(make_request(3, 'a'))) == [1]
    assert scheduler.waiting_streams == frozenset({'a', 'b'})
    scheduler.on_tokens(0, [0] * ACTION_DIM, is_final=True)
    assert ids(scheduler.pop_finished()) == [0]
    assert ids(scheduler.schedule().prefills) == [3]     # a's newest frame, in a's place
    assert ids(scheduler.replace_waiting(make_request(4, 'c'))) == []   # nothing to replace
    assert ids(scheduler.replace_waiting(make_request(5, 'b'))) == [2]
    driver = Driver(scheduler)
    driver.run({})
    assert driver.emitted == [3, 5, 4]


def serve_two_phase_locked_cameras(replace):
    """One request in flight (AR), an action takes ACTION_DIM steps, each camera captures every
    ACTION_DIM steps (camera b half a period after a) and its newest frame replaces its waiting
    one, through ``replace`` (scheduler, request). Returns the actions emitted per camera."""
    scheduler = Scheduler(1, ACTION_DIM, KVRing(500))
    driver = Driver(scheduler)
    next_id = iter(range(10_000))
    stream_of = {}
    for step in range(40 * ACTION_DIM):
        for stream, phase in (('a', 0), ('b', ACTION_DIM // 2)):
            if step % ACTION_DIM == phase:
                request = make_request(next(next_id), stream)
                stream_of[request.request_id] = stream
                replace(scheduler, request)
        driver.run_step()
    return {stream: sum(stream_of[i] == stream for i in driver.emitted) for stream in 'ab'}


def test_replace_waiting_serves_phase_locked_cameras_in_turn():
    """The pattern that starved a robot on a GPU: the engine falls free at the same phase of
    every camera period. Drop + append admits the same camera's frame every time; keeping
    the replaced frame's place serves the cameras in turn."""
    def drop_and_append(scheduler, request):
        scheduler.drop_waiting(request.stream_id)
        scheduler.submit(request)
    starved = serve_two_phase_locked_cameras(drop_and_append)
    assert min(starved.values()) <= 1                   # the old rule: one camera starves
    served = serve_two_phase_locked_cameras(lambda sch, request: sch.replace_waiting(request))
    assert abs(served['a'] - served['b']) <= 1 and min(served.values()) >= 15


@pytest.mark.parametrize('seed', range(20))
def test_random_replacements_keep_per_stream_order_and_lose_nothing(seed):
    """Random arrivals on three streams, each either queued or replacing its stream's waiting
    frame, several in flight and several prefills per step: every request is emitted or
    returned as replaced (never both), and each stream's actions leave in submission order."""
    rng = random.Random(seed)
    scheduler = Scheduler(rng.randint(1, 4), ACTION_DIM, big_ring(),
                          max_prefills=rng.randint(1, 3))
    driver = Driver(scheduler, gain=lambda request_id, remaining: rng.randint(1, remaining))
    replaced, submitted, stream_of = [], [], {}
    for request_id in range(60):
        stream = rng.choice('abc')
        request = make_request(request_id, stream, prefix_len_of(request_id))
        stream_of[request_id] = stream
        submitted.append(request_id)
        if rng.random() < 0.5:
            replaced += ids(scheduler.replace_waiting(request))
        else:
            scheduler.submit(request)
        if rng.random() < 0.7:
            driver.run_step()
    driver.run({})
    assert sorted(driver.emitted + replaced) == submitted
    assert not set(driver.emitted) & set(replaced)
    for stream in 'abc':
        mine = [i for i in driver.emitted if stream_of[i] == stream]
        assert mine == sorted(mine)


def test_replace_waiting_refuses_a_bad_request_and_replaces_nothing():
    scheduler = Scheduler(1, ACTION_DIM, KVRing(100))
    scheduler.submit(make_request(0, 'a'))
    scheduler.submit(make_request(1, 'a'))
    with pytest.raises(ValueError, match='num_slots'):
        scheduler.replace_waiting(make_request(2, 'a', prefix_len=200))
    with pytest.raises(ValueError, match='must exceed'):
        scheduler.replace_waiting(make_request(1, 'a'))
    assert scheduler.num_waiting == 2 and scheduler.active_streams == ('a',)


# ---------------------------------------------------------------- progress queries and errors

def test_history_len_follows_decided_tokens():
    scheduler = Scheduler(2, ACTION_DIM, KVRing(100))
    request = make_request(0, prefix_len=12)
    scheduler.submit(request)
    assert scheduler.schedule().prefills[0] is request   # the scheduler's record is the request
    with pytest.raises(ValueError, match='no token yet'):
        request.history_len
    scheduler.on_tokens(0, [0] * 1)
    assert request.history_len == 12                     # next input: token 1 at position 12
    scheduler.on_tokens(0, [0] * 3)
    assert request.history_len == 15
    assert request.num_tokens == 4 and request.num_remaining == 3
    assert request.prefix_len == 12


def test_submit_rejects_a_prefill_larger_than_the_ring():
    scheduler = Scheduler(2, ACTION_DIM, KVRing(50))
    with pytest.raises(ValueError, match=r'needs 57 slots \(prefix_len 50\).* only 50'):
        scheduler.submit(make_request(0, prefix_len=50))
    scheduler.submit(make_request(1, prefix_len=43))      # exactly the ring: accepted
    assert ids(scheduler.schedule().prefills) == [1]


def test_bad_input_is_rejected_with_the_field_name():
    with pytest.raises(ValueError, match='max_inflight'):
        Scheduler(0, ACTION_DIM, KVRing(10))
    with pytest.raises(ValueError, match='max_tokens'):
        Scheduler(1, 0, KVRing(10))
    with pytest.raises(ValueError, match='max_prefills'):
        Scheduler(2, ACTION_DIM, KVRing(10), max_prefills=0)
    with pytest.raises(ValueError, match='max_inflight_per_stream'):
        Scheduler(2, ACTION_DIM, KVRing(10), max_inflight_per_stream=0)
    with pytest.raises(ValueError, match='num_slots'):
        Request(0, 'a', prefix_len=10, num_tokens_needed=7, num_slots=15)
    with pytest.raises(ValueError, match='prefix_len'):
        Request(0, 'a', prefix_len=0, num_tokens_needed=7, num_slots=15)
    scheduler = Scheduler(2, ACTION_DIM, KVRing(100))
    with pytest.raises(ValueError, match='num_tokens_needed'):
        scheduler.submit(Request(0, 'a', prefix_len=5, num_tokens_needed=3, num_slots=8))
    scheduler.submit(make_request(5))
    with pytest.raises(ValueError, match='request_id: 5 must exceed'):
        scheduler.submit(make_request(5))
    with pytest.raises(ValueError, match='not in flight'):
        scheduler.on_tokens(5, [0] * 1)                         # still waiting
    scheduler.schedule()
    with pytest.raises(ValueError, match='tokens'):
        scheduler.on_tokens(5, [0] * (ACTION_DIM + 1))
    with pytest.raises(ValueError, match='tokens'):
        scheduler.on_tokens(5, [-1.5])


def test_bookkeeping_modules_import_no_torch():
    package = pathlib.Path(__file__).resolve().parents[1] / 'vla_spec_ros'
    for path in ('engine/scheduling/kv_ring.py', 'engine/scheduling/scheduler.py',
                 'engine/scheduling/request.py', 'engine/scheduling/step_stats.py',
                 'engine/drafting/draft_tree.py', 'engine/device/step_inputs.py',
                 'engine/drafting/draft_layout.py', 'engine/drafting/drafter.py',
                 'engine/drafting/previous_action_drafter.py',
                 'engine/drafting/temporal_merge.py', 'action_codec.py'):
        name = pathlib.Path(path).name
        tree = ast.parse((package / path).read_text())
        # Imports under ``if TYPE_CHECKING:`` serve annotations only and never run.
        annotation_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                           and getattr(node.test, 'id', '') == 'TYPE_CHECKING'
                           for inner in ast.walk(node)}
        imported = set()
        for node in ast.walk(tree):
            if id(node) in annotation_only:
                continue
            if isinstance(node, ast.Import):
                imported.update(alias.name.split('.')[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split('.')[0])
        # The host plans of a step and of the draft forwards build their arrays with numpy
        # (their relative imports are modules of this list, or the torch-free validation).
        allowed = {'__future__', 'bisect', 'collections', 'dataclasses', 'typing', 'math',
                   'functools'} | \
            ({'numpy'} if name in ('step_inputs.py', 'draft_layout.py') else set())
        assert imported <= allowed, (name, imported)


# ---------------------------------------------------------------- several prefills per step

def test_several_prefills_per_step_fill_the_pipeline_in_fifo_order():
    # max_inflight 4, two prefills per step, six frames waiting from step 0, one token per
    # step: steps 0 and 1 admit two each, the pipeline is then full until frames 0 and 1
    # finish in step 6 (admitted at 0, seven tokens), so frames 4 and 5 are admitted in step
    # 7; admission never reorders and the per-stream order holds across the two streams.
    driver = Driver(Scheduler(4, ACTION_DIM, big_ring(), max_prefills=2))
    requests = [make_request(i, 'ab'[i % 2]) for i in range(6)]
    driver.run({0: requests})
    assert [ids(s.prefills) for s in driver.steps[:8]] == \
        [[0, 1], [2, 3], [], [], [], [], [], [4, 5]]
    assert [driver.emit_step[i] for i in range(6)] == [6, 6, 7, 7, 13, 13]
    assert driver.emitted == [0, 1, 2, 3, 4, 5]


def test_several_prefills_stop_at_the_first_frame_the_ring_cannot_hold():
    # 27 slots per frame, room for two: the third waits although max_prefills is 3 and a
    # smaller fourth frame would fit (FIFO: it never bypasses the head).
    ring = KVRing(60)
    scheduler = Scheduler(7, ACTION_DIM, ring, max_prefills=3)
    for i, prefix_len in enumerate((20, 20, 20, 1)):
        scheduler.submit(make_request(i, prefix_len=prefix_len))
    assert ids(scheduler.schedule().prefills) == [0, 1]
    assert scheduler.num_waiting == 2
