"""Pairing one robot's image slots by stamp: the newest complete set wins (pure Python).

A multi-camera model reads one image per slot (e.g. [base, wrist]) taken at the same time.
Each slot has its own topic; their messages arrive in any order. `SlotPairing` keeps the last
few messages of each slot and, on every arrival, looks for the newest *complete set*: a
message of the first slot (the anchor) and, for every other slot, its message closest in
stamp, within `tolerance_s` of the anchor's stamp. Rules:

  - the newest complete set wins: sets are emitted in anchor order and never go back in time;
    a set older than one already emitted is dropped (counted);
  - a late slot: a set completes when its last member arrives, so a wrist frame that comes
    after the base frame of its time still pairs with it, as long as that base frame is still
    kept and no newer set was emitted meanwhile; the set's age (its anchor's stamp) then
    includes the wait, and the usual max_action_age bounds it. A slot keeps its messages of
    the last `keep_s` (the caller sets max_action_age: an older set is stale anyway), at most
    `MAX_PENDING`: a wrist camera 0.3 s behind a 30 Hz base camera still pairs (with a fixed
    8 messages it never did, and no reason named it);
  - an anchor that can no longer complete (another slot has a message past it, beyond the
    tolerance, and none within it) is unpaired: the first one is dropped and counted (a lost
    frame of one camera), a second one in a row is reported `out of sync` with both stamps,
    and the node refuses it (zero motion, the reason in the log and /diagnostics);
  - a slot that stops delivering leaves no complete set: the newest set grows old and the
    robot holds (stale input; the channel names the slot whose newest image is too old).

Messages of one slot are expected in stamp order (a camera driver's); one whose stamp is not
newer than its slot's previous one is dropped as out of order (`is_out_of_order`, told apart
from the drops above: a duplicate stamp or a camera clock that stepped back, not a busy
engine). A message ordered by its receipt time (`by_arrival`: an unstamped camera, or
``stamp_source: receipt``) is only out of order when its time is older: receipt times come in
arrival order, and a node clock coarser than the camera's period (a simulator publishing /clock
at 10 Hz, a 30 Hz camera) gives several frames one receipt time; the later arrival is the
newer frame, not a duplicate. Only messages the caller accepts enter: one
stamped in the future of the node clock is refused before it reaches the pairing
(observation_input.py), so it cannot make every later message look out of order; `clear`
forgets the order (`~/reset`, the node clock going back: clock_jumps.py, and, with
``stamp_source: receipt``, where no stamp is refused against the node clock, a slot whose
stamps step back by more than max_action_age: observation_input.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

MAX_PENDING = 64               # per slot at most, whatever keep_s (2 s at 30 Hz; a pairing
#                                scans pending pairs, so the bound keeps a stall cheap)
NUM_UNPAIRED_REFUSED = 2       # unpaired anchors in a row that are reported out of sync


@dataclass(frozen=True)
class SlotMessage:
    stamp_s: float       # the header stamp, or the receipt time (`SlotPairing.add`)
    item: Any            # what the caller keeps with it (message, FrameInfo)


@dataclass(frozen=True)
class Pairing:
    """What one arrival produced: a complete set (one SlotMessage per slot, in slot order),
    an out-of-sync reason, or neither."""

    members: tuple | None = None
    out_of_sync: str | None = None
    num_dropped: int = 0           # messages dropped by this arrival (late, unpaired)
    # This arrival dropped because its stamp is not newer than its slot's previous message
    # (duplicate stamps, a camera clock that stepped back; older, when ordered by arrival):
    # not the engine's doing.
    is_out_of_order: bool = False


def is_out_of_order(stamp_s: float, last_stamp_s: float, by_arrival: bool) -> bool:
    """Whether a message stamped `stamp_s` comes out of order after its slot's previous one
    (`last_stamp_s`): older, or, unless ordered by arrival (receipt times), the same stamp (a
    header stamp sent twice is a duplicate)."""
    if by_arrival:
        return stamp_s < last_stamp_s
    return stamp_s <= last_stamp_s


class SlotPairing:
    """The pairing state of one robot's `slots` (names, the first is the anchor)."""

    def __init__(self, slots, tolerance_s: float):
        if not slots:
            raise ValueError('image_slots: at least one slot')
        self.slots = tuple(slots)
        self.tolerance_s = float(tolerance_s)
        self.keep_s = float('inf')               # set by the caller (max_action_age)
        self._pending = [deque() for _ in self.slots]
        self._last_stamp = [float('-inf')] * len(self.slots)
        self._emitted_s = float('-inf')          # the newest emitted set's anchor stamp
        self._num_unpaired = 0

    def clear(self) -> None:
        """Forget every pending message and the order kept so far (`~/reset`, a jump back of
        the node clock): the next message of each slot is accepted whatever its stamp."""
        for pending in self._pending:
            pending.clear()
        self._last_stamp = [float('-inf')] * len(self.slots)
        self._emitted_s = float('-inf')
        self._num_unpaired = 0

    def add(self, slot: int, stamp_s: float, item, *, by_arrival: bool = False) -> Pairing:
        """A message of slot index `slot`; what it completes (see the module docstring).
        `by_arrival`: `stamp_s` is the message's receipt time, so a time equal to its slot's
        previous one is a later arrival, kept as the newer message."""
        if is_out_of_order(stamp_s, self._last_stamp[slot], by_arrival):
            return Pairing(is_out_of_order=True)
        if stamp_s < self._emitted_s - self.tolerance_s:
            return Pairing(num_dropped=1)        # late: older than a set already emitted
        self._last_stamp[slot] = stamp_s
        pending = self._pending[slot]
        pending.append(SlotMessage(stamp_s, item))
        num_dropped = 0
        while len(pending) > MAX_PENDING or pending[0].stamp_s < stamp_s - self.keep_s:
            pending.popleft()                    # too old to make a fresh set: dropped
            num_dropped += 1
        if len(self.slots) == 1:
            return self._emit(pending[-1], (pending[-1],), num_dropped)
        for anchor in reversed(self._pending[0]):            # the newest anchor first
            # Not older than the emitted set: an anchor of its very time that is still pending
            # arrived after it (`_emit` consumes the rest), a tie kept by arrival.
            if anchor.stamp_s < self._emitted_s:
                break
            members = self._members(anchor)
            if members is not None:
                return self._emit(anchor, members, num_dropped)
        return self._check_unpaired(num_dropped)

    def _members(self, anchor: SlotMessage) -> tuple | None:
        members = [anchor]
        for pending in self._pending[1:]:
            best = min(pending, key=lambda m: abs(m.stamp_s - anchor.stamp_s), default=None)
            if best is None or abs(best.stamp_s - anchor.stamp_s) > self.tolerance_s:
                return None
            members.append(best)
        return tuple(members)

    def _emit(self, anchor: SlotMessage, members: tuple, num_dropped: int) -> Pairing:
        self._emitted_s = anchor.stamp_s
        self._num_unpaired = 0
        for pending, member in zip(self._pending, members):   # consumed, and all older
            while pending and pending[0].stamp_s <= member.stamp_s:
                pending.popleft()
        return Pairing(members=members, num_dropped=num_dropped)

    def _check_unpaired(self, num_dropped: int) -> Pairing:
        """The oldest pending anchor that can no longer complete: dropped, or reported."""
        if not self._pending[0]:
            return Pairing(num_dropped=num_dropped)
        anchor = self._pending[0][0]
        for index, pending in enumerate(self._pending[1:], start=1):
            if pending and pending[-1].stamp_s > anchor.stamp_s + self.tolerance_s:
                break                            # this slot has passed the anchor unpaired
        else:
            return Pairing(num_dropped=num_dropped)
        self._pending[0].popleft()
        self._num_unpaired += 1
        if self._num_unpaired < NUM_UNPAIRED_REFUSED:
            return Pairing(num_dropped=num_dropped + 1)
        nearest = min(pending, key=lambda m: abs(m.stamp_s - anchor.stamp_s))
        offset = nearest.stamp_s - anchor.stamp_s
        return Pairing(out_of_sync=(
            f'image slots out of sync: {self.slots[index]} nearest stamp {offset:+.3f} s from '
            f'{self.slots[0]}\'s {anchor.stamp_s:.3f} s, beyond image_sync_tolerance '
            f'{self.tolerance_s:.3f} s ({self._num_unpaired} {self.slots[0]} frames in a row '
            'without a partner)'), num_dropped=num_dropped)


__all__ = ['SlotPairing', 'SlotMessage', 'Pairing', 'is_out_of_order', 'MAX_PENDING',
           'NUM_UNPAIRED_REFUSED']
