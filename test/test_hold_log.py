"""Pure Python (no rclpy, no torch): which hold reasons reach the log (ros/hold_log.py), how a
jump back of the node clock is noticed (ros/clock_jumps.py), and that forgetting the pairing's
order lets any stamp in again (ros/observation_sync.py). The rules are the modules' docstrings;
the DDS side is test_ros_stamps.py."""
from vla_spec_ros.ros.clock_jumps import ClockWatch
from vla_spec_ros.ros.hold_log import MAX_REASONS, THROTTLE_S, HoldLog, reason_key
from vla_spec_ros.ros.observation_sync import SlotPairing

STALE = 'hold: stale observation: age {:.3f} s > max_action_age 0.500 s (image slot wrist)'
RUN_OUT = 'hold: chunk ran out: the 8 steps of the image at {:.3f} s are done'


def test_numbers_do_not_make_a_reason_distinct_but_words_do():
    assert reason_key(STALE.format(0.512)) == reason_key(STALE.format(3.75))
    assert reason_key(STALE.format(0.5)) != reason_key(STALE.format(0.5).replace('wrist',
                                                                                 'base'))
    assert reason_key('offset +0.050 s, 1e-3 s, -2 frames') == 'offset # s, # s, # frames'


def test_a_new_reason_is_logged_at_once_and_repeats_of_it_are_throttled():
    log = HoldLog()
    assert log.admit(STALE.format(0.51), now_s=100.0) == STALE.format(0.51)
    assert log.admit(STALE.format(0.61), now_s=100.1) is None             # a repeat
    # Another reason of the same robot, within the throttle: not hidden by the first.
    assert log.admit(RUN_OUT.format(99.0), now_s=100.2) == RUN_OUT.format(99.0)
    assert log.admit(STALE.format(1.0), now_s=100.0 + THROTTLE_S - 0.01) is None
    line = log.admit(STALE.format(2.5), now_s=100.0 + THROTTLE_S)
    assert line == STALE.format(2.5) + ' (2 more since it was last logged)'
    assert log.admit(STALE.format(2.6), now_s=100.0 + THROTTLE_S + 0.1) is None


def test_each_robot_has_its_own_throttle():
    robots = {'a': HoldLog(), 'b': HoldLog()}
    assert robots['a'].admit(RUN_OUT.format(1.0), now_s=5.0) is not None
    # Robot b's same reason, a moment later: a robot of its own, logged.
    assert robots['b'].admit(RUN_OUT.format(1.0), now_s=5.01) is not None
    assert robots['a'].admit(RUN_OUT.format(1.2), now_s=5.02) is None


def test_the_reasons_remembered_stay_bounded():
    log = HoldLog()
    for i in range(3 * MAX_REASONS):              # distinct reasons, one every throttle period
        assert log.admit(f'bad input: reason {chr(65 + i % 26)}{"x" * (i // 26)}',
                         now_s=i * THROTTLE_S) is not None
    assert len(log._logged) <= MAX_REASONS


def test_a_clock_reading_earlier_than_the_one_before_is_a_jump():
    watch = ClockWatch()
    assert watch.check(1000.0) is None                 # the first reading
    assert watch.check(1000.0) is None                 # a clock that stands still
    assert watch.check(1000.5) is None
    jump = watch.check(10.0)                           # a simulator reset
    assert (jump.from_s, jump.to_s, jump.back_s) == (1000.5, 10.0, 990.5)
    assert 'went back 990.500 s' in jump.describe()
    assert watch.check(10.1) is None                   # time runs on from the new line
    assert watch.check(10.0999).back_s > 0.0           # any step back counts


def test_clearing_the_pairing_forgets_its_order():
    pairing = SlotPairing(['base', 'wrist'], 0.02)
    pairing.add(0, 1000.0, 'b')
    assert pairing.add(1, 1000.0, 'w').members is not None
    assert pairing.add(0, 10.0, 'late').is_out_of_order        # before the emitted set
    pairing.clear()
    pairing.add(0, 10.0, 'b2')
    result = pairing.add(1, 10.01, 'w2')
    assert [m.item for m in result.members] == ['b2', 'w2']
    one = SlotPairing(['image'], 0.02)
    one.add(0, 1000.0, 'x')
    one.clear()
    assert one.add(0, 10.0, 'y').members[0].item == 'y'
