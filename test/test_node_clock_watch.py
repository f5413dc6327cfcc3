"""ros/node_clock_watch.py: whether the node clock can age frames (sim time's /clock), on a
hand-driven clock and monotonic time. Over DDS: test_ros_stamps.py (a /clock that stops)."""
from types import SimpleNamespace

from vla_spec_ros.ros.node_clock_watch import (REASON_CLOCK_STOPPED, REASON_NO_CLOCK,
                                               NodeClockWatch)


class HandClock:
    def __init__(self, ns: int, ros_time_is_active: bool = True):
        self.ns, self.ros_time_is_active = ns, ros_time_is_active

    def now(self):
        return SimpleNamespace(nanoseconds=self.ns)


class Steady:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_system_clock_is_always_trusted():
    clock, steady = HandClock(0, ros_time_is_active=False), Steady()
    watch = NodeClockWatch(clock, steady)
    steady.t += 60.0
    assert watch.reason(0.5) is None


def test_sim_time_without_a_clock_message_holds():
    watch = NodeClockWatch(HandClock(0), Steady())
    assert watch.reason(0.5).startswith(REASON_NO_CLOCK)


def test_a_clock_that_stands_for_longer_than_the_bound_holds_until_it_moves():
    clock, steady = HandClock(5 * 10**9), Steady()
    watch = NodeClockWatch(clock, steady)
    assert watch.reason(0.5) is None
    steady.t += 0.4
    assert watch.reason(0.5) is None                 # standing 0.4 s: within the bound
    steady.t += 0.2
    reason = watch.reason(0.5)
    assert reason.startswith(REASON_CLOCK_STOPPED) and '0.60 s' in reason
    clock.ns += 10**7                                # /clock runs again
    assert watch.reason(0.5) is None
    steady.t += 0.3
    clock.ns += 10**7
    assert watch.reason(0.5) is None                 # a slow simulator is not a stopped one
