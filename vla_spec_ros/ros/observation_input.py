"""One robot's observation: its image slots (one topic each, raw or compressed), paired by
stamp (observation_sync.py), and its paired inputs (input_adapter.py: the robot state,
state_input.py; listed by robot_io.build_inputs) read at the set's time, into its frame
slot.

Topics: one camera (no `image_slots`): `<prefix>image` (or `<prefix>image/compressed`), as
before; with `image_slots: [base, wrist]`: `<prefix>base/image`, `<prefix>wrist/image` (or
`.../image/compressed`, per slot from `image_transports`). The callbacks only stamp and pair;
conversion happens on the worker (worker.py). A complete set becomes one frame_slot.
Observation (latest wins: an untaken one is replaced and counted as dropped) carrying each
input's value under its key; an out-of-sync report or an input's problem (a state that cannot
be paired) travels in it as its `error`, so the worker refuses or holds in frame order.

Stamps and order (docs/robot.md, "Stamps, order and clock jumps"):
  - an image with a negative header stamp (with `stamp_source: header`; 0 means unstamped),
    or stamped more than `max_action_age` ahead of the node clock (by the time the node
    ages it by: `stamp_source`), is refused on arrival (`on_refused`: the robot holds with
    `observation from the future`, naming the slot with several). It never enters the pairing
    and is never the newest observation, so it moves nothing: the next good image is answered;
  - the order the pairing keeps is by header stamp with several slots (pairing needs it), and
    by the time the node ages a frame by with one (`stamp_source: receipt` orders by arrival,
    so a header stamp the node does not trust cannot hold later frames back either); an
    unstamped image is ordered by its receipt. Frames ordered by receipt with the same time
    are kept in arrival order, not dropped as duplicates (a /clock coarser than the camera's
    period gives several frames one receipt time: observation_sync.py);
  - the node clock is read under the lock at every image and every watchdog tick
    (`check_clock`); a reading earlier than the one before (clock_jumps.py) forgets the order,
    the newest observation and each slot's newest image, then tells `on_clock_jump`.
"""
from __future__ import annotations

import math
import threading
import time

from sensor_msgs.msg import CompressedImage, Image

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.clock_jumps import ClockWatch
from vla_spec_ros.ros.frame_slot import FrameInfo, Observation
from vla_spec_ros.ros.message_time import unnormalised_stamp_reason
from vla_spec_ros.ros.observation_sync import SlotPairing
from vla_spec_ros.ros.qos import IMAGE_QOS


def frame_info(msg, now) -> FrameInfo:
    """The FrameInfo of an image `msg` received at `now` (rclpy Time): its header stamp, or
    the receipt time when the driver did not stamp (stamp_s stays 0.0 then)."""
    stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
    arrival = now.to_msg()
    stamp = msg.header.stamp if stamp_s > 0.0 else arrival
    return FrameInfo(stamp, stamp_s, now.nanoseconds * 1e-9, time.monotonic(),
                     receipt_stamp=arrival)


def slot_topic(prefix: str, slot: str, transport: str) -> str:
    base = f'{prefix}{slot}/image' if slot else f'{prefix}image'
    return base + '/compressed' if transport == 'compressed' else base


class ObservationInput:
    """`on_observation(observation)` gets each complete set (executor thread);
    `on_dropped(count)` counts messages dropped by the pairing; `on_out_of_order(info,
    slot_label)` (optional) gets an image dropped for a stamp not newer than its slot's
    previous one (observation_sync.py). `settings()` returns the
    robot's NodeSettings in force. `on_refused(info, reason)` gets an image refused on arrival
    (stamped in the future, or negative); `on_clock_jump(jump)` a clock_jumps.ClockJump, after
    the order kept on the old time line was forgotten (module docstring). `inputs`: the
    robot's paired inputs (input_adapter.InputAdapter), read in this order; this object owns
    them."""

    def __init__(self, node, prefix: str, settings, on_observation, on_dropped, get_settings,
                 *, on_refused, on_clock_jump, on_out_of_order=None, inputs=()):
        self.node, self._prefix = node, prefix
        self._on_observation, self._on_dropped = on_observation, on_dropped
        self._on_out_of_order = on_out_of_order
        # The newest image dropped as out of order, for the hold's reason (out_of_order_note).
        self._out_of_order: FrameInfo | None = None
        self._on_refused, self._on_clock_jump = on_refused, on_clock_jump
        self._settings = get_settings
        self.slot_names = tuple(settings.image_slots) or ('',)
        self._lock = threading.Lock()
        self._clock_watch = ClockWatch()
        self._pairing = SlotPairing([s or 'image' for s in self.slot_names],
                                    settings.image_sync_tolerance)
        self.newest: FrameInfo | None = None                  # the newest complete set's
        self.newest_per_slot: list = [None] * len(self.slot_names)
        self.inputs = list(inputs)
        keys = [adapter.key for adapter in self.inputs]
        if len(set(keys)) != len(keys) or not all(keys):
            raise ValueError(f'inputs: each input needs its own non-empty key, got {keys}')
        self._subs = []
        for index, slot in enumerate(self.slot_names):
            transport = settings.slot_transport(index)
            msg_type = CompressedImage if transport == 'compressed' else Image
            self._subs.append(node.create_subscription(
                msg_type, slot_topic(prefix, slot, transport),
                lambda msg, index=index: self._on_image(index, msg), IMAGE_QOS))

    @property
    def is_multi_slot(self) -> bool:
        return len(self.slot_names) > 1

    def _slot_label(self, index: int) -> str:
        """' (image slot <name>)' with several slots, else ''."""
        return f' (image slot {self.slot_names[index]})' if self.is_multi_slot else ''

    def check_clock(self):
        """Read the node clock (module docstring): on a jump back, forget the order kept so
        far and tell `on_clock_jump`. Returns the reading (rclpy Time)."""
        with self._lock:
            now = self.node.get_clock().now()
            jump = self._clock_watch.check(now.nanoseconds * 1e-9)
            if jump is not None:
                self._forget()
        if jump is not None:
            self._on_clock_jump(jump)
        return now

    def _arrival_reason(self, index: int, info: FrameInfo, settings) -> str | None:
        """Why an image just received is refused on arrival (a negative header stamp, or one
        in the future), or None. Only these are checked here: a stale image is aged again by
        the worker."""
        if info.stamp_s < 0.0 and settings.stamp_source == 'header':
            # 0 is "unstamped" (the receipt time stands in); below 0 is a driver or clock bug,
            # and the receipt time must not stand in for it.
            return (f'{cmd.REASON_BAD_INPUT}: header stamp {info.stamp_s:.3f} s is negative '
                    f'(0 means unstamped){self._slot_label(index)}')
        malformed = unnormalised_stamp_reason(info.stamp)
        if malformed is not None and settings.stamp_source == 'header':
            # (The command's header would carry it on: a consumer may refuse such a time.)
            return f'{cmd.REASON_BAD_INPUT}: {malformed}{self._slot_label(index)}'
        age_s = cmd.observation_age(info.receipt_s, info.stamp_s, info.receipt_s, settings)
        reason = cmd.freshness_reason(age_s, settings, max_age_s=math.inf)
        return None if reason is None else reason + self._slot_label(index)

    def _stamps_stepped_back(self, index: int, info: FrameInfo, settings) -> float | None:
        """(Under the lock.) With several slots aged by receipt, the pairing still orders by
        header stamp, and no stamp is refused against the node clock: a slot whose stamp
        steps back by more than max_action_age (its camera's clock was reset, or the stamp
        before was a glitch far ahead) would have every later image dropped as out of order.
        How far it stepped back then (the pairing order is forgotten), else None."""
        previous = self.newest_per_slot[index]
        if (not self.is_multi_slot or settings.stamp_source != 'receipt' or previous is None
                or info.stamp_s <= 0.0):
            return None
        step_s = previous.stamp_s - info.stamp_s
        return step_s if step_s > settings.max_action_age else None

    def _is_ordered_by_receipt(self, info: FrameInfo, settings) -> bool:
        """Whether the pairing orders (and, with several slots, pairs) a message by its
        receipt time rather than its header stamp: an unstamped image, or, with one slot,
        `stamp_source: receipt` (the time the node ages it by: command_rules.observation_time;
        several slots are paired by header stamp whatever the stamp_source)."""
        if info.stamp_s <= 0.0:
            return True
        return not self.is_multi_slot and settings.stamp_source == 'receipt'

    def _order_stamp(self, info: FrameInfo, settings) -> float:
        """The time the pairing orders (and, with several slots, pairs) a message by."""
        return info.receipt_s if self._is_ordered_by_receipt(info, settings) else info.stamp_s

    def _on_image(self, index: int, msg) -> None:
        info = frame_info(msg, self.check_clock())
        settings = self._settings()
        refused = self._arrival_reason(index, info, settings)
        if refused is not None:               # refused: it must not move the order
            self._on_refused(info, refused)
            return
        with self._lock:
            stepped_back = self._stamps_stepped_back(index, info, settings)
            if stepped_back is not None:
                self._pairing.clear()
            self.newest_per_slot[index] = info
            self._pairing.tolerance_s = settings.image_sync_tolerance
            self._pairing.keep_s = settings.max_action_age
            pairing = self._pairing.add(index, self._order_stamp(info, settings), (msg, info),
                                        by_arrival=self._is_ordered_by_receipt(info, settings))
        if stepped_back is not None:
            topic = slot_topic(self._prefix, self.slot_names[index], 'raw')
            self.node.get_logger().warning(
                f'{topic}: its stamps stepped back {stepped_back:.3f} s (a camera clock reset, '
                'or a bad stamp before it): the pairing order is forgotten',
                throttle_duration_sec=2.0)
        if pairing.is_out_of_order:
            self._out_of_order = info
            if self._on_out_of_order is not None:
                self._on_out_of_order(info, self._slot_label(index))
        if pairing.num_dropped:
            self._on_dropped(pairing.num_dropped)
        if pairing.out_of_sync is not None:
            self._on_observation(Observation((msg,), info, error=(
                f'{cmd.REASON_BAD_INPUT}: {pairing.out_of_sync}'), is_bad_input=True))
            return
        if pairing.members is None:
            return
        messages = tuple(m.item[0] for m in pairing.members)
        anchor = pairing.members[0].item[1]
        # The set's time is its first slot's stamp. Its latency counts from its first image's
        # arrival; aged by receipt, it is as old as that image too (not the set's
        # completion: a lagging slot must not make an old image fresh); aged by stamp, the
        # anchor's own arrival bounds the anchor's stamp (FrameInfo).
        arrivals = [m.item[1] for m in pairing.members]
        first = min(arrivals, key=lambda a: a.receipt_s)
        arrival = first if settings.stamp_source == 'receipt' else anchor
        info = FrameInfo(anchor.stamp, anchor.stamp_s, arrival.receipt_s, first.receipt_mono,
                         receipt_stamp=arrival.receipt_stamp)
        self.newest = info
        self._on_observation(self._read_inputs(messages, info, settings))

    def _read_inputs(self, messages, info: FrameInfo, settings) -> Observation:
        """The observation with each input's value at its time, or with the first input's
        problem as its error (input_adapter.py)."""
        # Read at the time the image is aged from: a camera clock ahead of the node's
        # (accepted within max_action_age) would otherwise look up the state one offset away.
        time_s = cmd.aged_from(info.stamp_s, info.receipt_s, settings)
        values = {}
        for adapter in self.inputs:
            value, problem = adapter.read_at(time_s, settings)
            if problem is not None:
                return Observation(messages, info, error=problem[0], is_bad_input=problem[1])
            values[adapter.key] = value
        return Observation(messages, info, inputs=values)

    def input(self, key: str):
        """The input adapter of `key`, or None."""
        return next((adapter for adapter in self.inputs if adapter.key == key), None)

    def stale_slot_reason(self, age_of, max_age_s: float | None, settings) -> str | None:
        """With several slots: why the robot holds because one slot stopped (its newest image
        is missing or too old), naming the slot; None otherwise."""
        if not self.is_multi_slot:
            return None
        for name, info in zip(self.slot_names, self.newest_per_slot):
            if info is None:
                return f'{cmd.REASON_NO_IMAGE}: image slot {name}'
            reason = cmd.freshness_reason(age_of(info), settings, max_age_s=max_age_s)
            if reason is not None:
                return f'{reason} (image slot {name})'
        return None

    def out_of_order_note(self, reason: str, newest, settings) -> str:
        """``reason`` for a stale (or missing) image, naming the images that still arrive
        (the latest less than max_action_age ago, after ``newest``) but are dropped as out of
        order (a camera clock that stepped back, repeated stamps): before, /diagnostics blamed
        a camera that streams. Any other reason as it is."""
        dropped = self._out_of_order
        if (dropped is None
                or cmd.reason_kind(reason) not in (cmd.REASON_STALE, cmd.REASON_NO_IMAGE)
                or (newest is not None and dropped.receipt_mono <= newest.receipt_mono)
                or time.monotonic() - dropped.receipt_mono > settings.max_action_age):
            return reason
        return (f'{reason} (images still arrive but are dropped as out of order: the latest, '
                f'stamped {dropped.stamp_s:.3f} s, is not newer than the image before it)')

    def current_positions(self, settings):
        """The measured joint positions, from the state input (state_input.py), or None."""
        state = self.input('state')
        return None if state is None else state.current_positions(settings)

    def clear(self) -> None:
        """Forget the pending messages and the order kept (`~/reset`)."""
        with self._lock:
            self._pairing.clear()

    def forget_inputs(self) -> None:
        """Drop what the other inputs (the state) kept: what they hold was read under
        settings that no longer apply (state_joint_names changed: an array kept in the old
        layout would be read in the new one)."""
        for adapter in self.inputs:
            adapter.forget()

    def _forget(self) -> None:
        """The node clock went back: what was kept on the old time line goes (under the
        lock), the paired inputs' values too (a joint state of before a simulator reset is
        not where the robot is). The watchdog then holds for `no image received` until a new
        image comes."""
        self._pairing.clear()
        self.newest = None
        self.newest_per_slot = [None] * len(self.slot_names)
        for adapter in self.inputs:
            adapter.forget()

    def destroy(self) -> None:
        for sub in self._subs:
            self.node.destroy_subscription(sub)
        for adapter in self.inputs:
            adapter.destroy()


__all__ = ['ObservationInput', 'frame_info', 'slot_topic']
