"""InferenceWorker.paused() (vla_spec_ros/ros/worker.py): no turn of the loop runs inside it,
it nests (the same thread may pause again inside a pause), and the loop resumes after the
outermost block ends. A stand-in engine that always has work counts the steps, beside a robot whose
slot stays empty; no ROS."""
import threading
import time

from vla_spec_ros.ros.worker import InferenceWorker

TIMEOUT = 30.0


class CountingEngine:
    def __init__(self):
        self.steps = 0

    def has_work(self):
        return True

    def step(self):
        self.steps += 1
        time.sleep(0.001)
        return []


class IdleRobot:
    """A robot whose frame slot is always empty."""
    stream_id = 'default'

    class slot:
        @staticmethod
        def take(timeout):
            return None


def _wait_until(predicate, what):
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f'timed out waiting for {what}'
        time.sleep(0.005)


def test_a_pause_nests_stops_every_turn_and_resumes_after_the_outermost():
    engine = CountingEngine()
    worker = InferenceWorker(engine, [IdleRobot()], threading.Lock(), threading.Event(),
                             dict)
    worker.start()
    try:
        _wait_until(lambda: engine.steps > 3, 'the loop stepping')
        done = threading.Event()

        def nested():
            with worker.paused():
                inside = engine.steps
                with worker.paused():          # the same thread again: no deadlock
                    time.sleep(0.2)            # a window for a turn that must not run
                    assert engine.steps == inside
                time.sleep(0.1)                # still paused after the inner block
                assert engine.steps == inside
            done.set()

        thread = threading.Thread(target=nested)
        thread.start()
        thread.join(TIMEOUT)
        assert done.is_set(), 'a nested pause did not end'
        after = engine.steps
        _wait_until(lambda: engine.steps > after, 'the loop resuming')
    finally:
        assert worker.stop()


class OneStepEngine:
    """An engine whose one step finishes one frame of each of `streams`, then has no work;
    `resets` counts engine resets."""

    def __init__(self, streams):
        from types import SimpleNamespace
        self.pending = [SimpleNamespace(frame=SimpleNamespace(stream_id=s)) for s in streams]
        self.resets = 0

    def has_work(self):
        return bool(self.pending)

    def step(self):
        finished, self.pending = self.pending, []
        return finished

    def reset(self):
        self.resets += 1


class AnsweringRobot(IdleRobot):
    """A robot that records its finished frames and holds; `broken` raises on a result."""

    def __init__(self, stream_id, broken=False):
        self.stream_id, self.broken = stream_id, broken
        self.handled, self.rejected = [], []

    def handle_finished(self, item):
        if self.broken:
            raise RuntimeError('an output failed')
        self.handled.append(item)

    def reject_result(self, reason):
        self.rejected.append(reason)


def test_one_robots_failing_result_holds_it_alone():
    """One robot's result that fails to publish holds that robot with the reason; the other
    robot's result of the same step still goes out and the engine is not reset (before: the
    whole step was taken for an engine failure: every robot held, the engine reset)."""
    broken, healthy = AnsweringRobot('a', broken=True), AnsweringRobot('b')
    engine = OneStepEngine(['a', 'b'])
    worker = InferenceWorker(engine, [broken, healthy], threading.Lock(), threading.Event(),
                             dict)
    worker.start()
    try:
        _wait_until(lambda: healthy.handled and broken.rejected, 'both results decided')
    finally:
        assert worker.stop()
    assert 'an output failed' in broken.rejected[0] and healthy.rejected == []
    assert engine.resets == 0
