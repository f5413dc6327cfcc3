"""Pairing image slots by stamp (ros/observation_sync.py), pure Python: no rclpy, no torch.

Each test writes the arrival order out and states the expected set from the rules in the
module's docstring (newest complete set wins, tolerance, late slot, lost frame, out of sync,
out of order: a duplicate header stamp, but not a receipt time shared by several arrivals).
"""
import pytest

from vla_spec_ros.ros.observation_sync import MAX_PENDING, SlotPairing

TOL = 0.02
BASE, WRIST = 0, 1


def stamps(pairing):
    return None if pairing.members is None else tuple(m.stamp_s for m in pairing.members)


def test_one_slot_emits_every_frame():
    pairing = SlotPairing(['image'], TOL)
    assert stamps(pairing.add(0, 1.0, 'a')) == (1.0,)
    assert stamps(pairing.add(0, 1.1, 'b')) == (1.1,)


def test_frames_of_one_time_pair_within_the_tolerance_in_either_order():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    assert pairing.add(BASE, 1.000, 'b0').members is None            # waits for its wrist
    result = pairing.add(WRIST, 1.015, 'w0')                           # 15 ms apart: paired
    assert stamps(result) == (1.000, 1.015)
    assert [m.item for m in result.members] == ['b0', 'w0']
    assert pairing.add(WRIST, 1.100, 'w1').members is None             # wrist first this time
    assert stamps(pairing.add(BASE, 1.105, 'b1')) == (1.105, 1.100)


def test_the_newest_complete_set_wins_and_older_ones_are_not_emitted_after_it():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    pairing.add(BASE, 1.0, 'b0')
    pairing.add(BASE, 1.1, 'b1')
    assert stamps(pairing.add(WRIST, 1.1, 'w1')) == (1.1, 1.1)         # b0 has no wrist yet
    late = pairing.add(WRIST, 1.0, 'w0')              # b0's wrist, after w1: out of order
    assert late.members is None and late.is_out_of_order


def test_a_late_slot_still_pairs_with_its_pending_anchor():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    for i in range(3):                                # three base frames before any wrist
        assert pairing.add(BASE, 1.0 + 0.1 * i, f'b{i}').members is None
    # The wrist of the newest base frame arrives: the newest set wins, the older anchors go.
    assert stamps(pairing.add(WRIST, 1.2, 'w2')) == (1.2, 1.2)


def test_the_closest_partner_is_chosen():
    pairing = SlotPairing(['base', 'wrist'], 0.05)
    pairing.add(WRIST, 0.97, 'w_early')
    pairing.add(WRIST, 1.01, 'w_close')
    assert [m.item for m in pairing.add(BASE, 1.0, 'b').members] == ['b', 'w_close']


def test_one_lost_frame_is_dropped_and_the_next_set_pairs():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    pairing.add(BASE, 1.0, 'b0')                       # its wrist frame is lost
    result = pairing.add(WRIST, 1.1, 'w1')             # wrist has passed b0 unpaired
    assert result.members is None and result.out_of_sync is None and result.num_dropped == 1
    assert stamps(pairing.add(BASE, 1.1, 'b1')) == (1.1, 1.1)


def test_slots_offset_beyond_the_tolerance_are_reported_out_of_sync():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    reports = []
    for i in range(4):               # the wrist stamps run half a period (50 ms) ahead
        t = 1.0 + 0.1 * i
        for slot, stamp in ((BASE, t), (WRIST, t + 0.05)):
            result = pairing.add(slot, stamp, None)
            assert result.members is None
            reports.append(result.out_of_sync)
    reasons = [r for r in reports if r]
    assert reasons, 'an offset beyond the tolerance must be reported'
    assert 'out of sync' in reasons[0] and 'wrist' in reasons[0] and '0.050' in reasons[0]


def test_a_stalled_slot_leaves_no_set_and_no_out_of_sync_report():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    pairing.add(WRIST, 0.9, 'w')
    results = [pairing.add(BASE, 1.0 + 0.1 * i, None) for i in range(MAX_PENDING + 3)]
    assert all(r.members is None and r.out_of_sync is None for r in results)
    # The pending anchors are bounded: the oldest ones are dropped and counted.
    assert sum(r.num_dropped for r in results) == 3


def test_out_of_order_frames_of_one_slot_are_dropped():
    pairing = SlotPairing(['base', 'wrist'], TOL)
    pairing.add(BASE, 1.0, 'b0')
    old = pairing.add(BASE, 0.9, 'old')
    same = pairing.add(BASE, 1.0, 'duplicate stamp')
    # Out of order: told apart from drops (a camera's clock, not a busy engine).
    assert old.is_out_of_order and same.is_out_of_order
    assert old.num_dropped == same.num_dropped == 0 and old.members is None
    assert stamps(pairing.add(WRIST, 1.0, 'w0')) == (1.0, 1.0)


def test_equal_receipt_times_are_kept_in_arrival_order_and_only_older_ones_are_dropped():
    """Ordered by receipt time (`by_arrival`: stamp_source receipt, an unstamped camera), a
    /clock at 10 Hz gives three 30 Hz frames one receipt time: each is a newer frame, not a
    duplicate (before, two of every three were dropped as out of order)."""
    pairing = SlotPairing(['image'], TOL)
    for item in ('a', 'b', 'c'):
        result = pairing.add(0, 50.0, item, by_arrival=True)
        assert not result.is_out_of_order and [m.item for m in result.members] == [item]
    assert pairing.add(0, 49.9, 'older', by_arrival=True).is_out_of_order
    assert stamps(pairing.add(0, 50.1, 'd', by_arrival=True)) == (50.1,)


def test_header_stamps_sent_twice_are_still_duplicates():
    pairing = SlotPairing(['image'], TOL)
    assert stamps(pairing.add(0, 50.0, 'a')) == (50.0,)
    assert pairing.add(0, 50.0, 'a again').is_out_of_order


def test_unstamped_cameras_pair_each_set_of_one_receipt_time():
    """Two unstamped cameras (paired by receipt time) on a coarse clock: the second set of the
    same receipt time is a newer set, emitted after the first."""
    pairing = SlotPairing(['base', 'wrist'], TOL)
    pairing.add(BASE, 50.0, 'b0', by_arrival=True)
    assert [m.item for m in pairing.add(WRIST, 50.0, 'w0', by_arrival=True).members] == [
        'b0', 'w0']
    assert pairing.add(BASE, 50.0, 'b1', by_arrival=True).members is None  # waits for its wrist
    result = pairing.add(WRIST, 50.0, 'w1', by_arrival=True)
    assert not result.is_out_of_order and [m.item for m in result.members] == ['b1', 'w1']


def test_no_slot_is_refused():
    with pytest.raises(ValueError, match='image_slots'):
        SlotPairing([], TOL)


@pytest.mark.parametrize('keep_s, pairs', [(0.5, True), (0.2, False)])
def test_a_slot_lagging_within_keep_s_still_pairs_and_beyond_it_its_anchors_are_dropped(
        keep_s, pairs):
    """A wrist camera whose frames arrive 0.3 s after the 30 Hz base frames of their time:
    before, a slot kept its last 8 messages (0.27 s of base frames), so no wrist frame ever
    found its base frame, nothing was reported, and the robot held for a generic stale
    observation. Kept by time (keep_s, the caller's max_action_age) the sets form, 0.3 s old;
    with keep_s under the lag they cannot be fresh, and the base frames go, counted."""
    pairing = SlotPairing(['base', 'wrist'], TOL)
    pairing.keep_s = keep_s
    lag = 9                                      # frames: 0.3 s at 30 Hz
    sets, dropped = [], 0
    for i in range(60):
        for slot, index in ((BASE, i), (WRIST, i - lag)):
            if index < 0:
                continue
            result = pairing.add(slot, round(index / 30, 6), (slot, index))
            dropped += result.num_dropped
            if result.members is not None:
                sets.append(tuple(m.item[1] for m in result.members))
    if pairs:
        assert sets == [(i, i) for i in range(60 - lag)] and dropped == 0
    else:
        assert sets == [] and dropped > 0
