"""Published frames and the answers the VLA node sends for them (pure Python: no rclpy, no
torch).

`next_stamp_ns` stamps frames strictly increasing; `FrameRegistry` remembers the newest
published stamps, traces a twist stamp back to its frame (and chunk step), and measures each
frame's first-answer latency; `AnswerPairs` pairs answering twists with gripper messages and
hands them out as `MatchedCommand`s. Both ways of stepping the simulator consume the pairs:
lock-step (`lockstep_matching.LockstepMatcher`) and real time (`realtime_clock.RealtimeCommand`).

Pairing answers. The node publishes, for every action, the twist stamped with the frame's stamp
and then its gripper message, from one thread (node.py `_publish_command`) over reliable topics;
zero-twist holds are stamped with the node clock and carry no gripper. So, over the node's
whole life (not per frame, not per episode), the n-th twist whose stamp is a published frame's
pairs with the n-th gripper message: `AnswerPairs` keeps one FIFO of each and pops pairs in
order. Pairing by position inside a per-frame window would go wrong as soon as a gripper
arrived after the next frame began (a late duplicate answer shifts every later pair by one).
A chunked model's node publishes step i of a frame's chunk with the stamp frame stamp +
round(i * control_period * 1e9) ns (ros/message_time.offset_stamp), each step with its gripper:
`FrameRegistry.frame_of` recognises such stamps (the bridge's control_period equals the node's),
so chunk steps pair like answers and `MatchedCommand` carries the frame stamp and step index.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from vla_spec_ros.validation import check_int

# Longest chunk whose step stamps `FrameRegistry.frame_of` traces back to their frame.
MAX_CHUNK_STEPS = 256


def next_stamp_ns(now_ns: int, last_ns: int | None) -> int:
    """A frame stamp from the clock, forced strictly above the previous one."""
    return int(now_ns) if last_ns is None or now_ns > last_ns else int(last_ns) + 1


class FrameRegistry:
    """Stamps of recently published frames and when each was first published.

    Tells answers to published frames (action twists) from other twists, and measures
    observation-to-command latency once per frame (the first answer). Only the newest
    `max_frames` stamps are kept: an answer to an older frame would look like a hold and shift
    the pairing in `AnswerPairs`, so the default covers far more frames than any answer can lag
    (the VLA node refuses observations older than its max_action_age).
    """

    def __init__(self, max_frames: int = 16384):
        self._max_frames = check_int('max_frames', max_frames, minimum=1)
        self._published: OrderedDict[int, float] = OrderedDict()   # stamp_ns -> publish time
        self._answered: set[int] = set()

    def add(self, stamp_ns: int, published_s: float) -> None:
        if self._published and stamp_ns <= next(reversed(self._published)):
            raise ValueError(f'stamp_ns: {stamp_ns} is not above the previous frame stamp')
        self._published[stamp_ns] = published_s
        while len(self._published) > self._max_frames:
            old, _ = self._published.popitem(last=False)
            self._answered.discard(old)

    def __contains__(self, stamp_ns: int) -> bool:
        return stamp_ns in self._published

    def frame_of(self, stamp_ns: int, step_period_s: float | None = None,
                 max_steps: int = MAX_CHUNK_STEPS) -> tuple[int, int] | None:
        """(frame stamp, chunk step index) of a twist stamp: (stamp, 0) for a frame's own
        stamp; with `step_period_s`, (frame, i) when stamp = frame + round(i * step_period_s *
        1e9) ns for a registered frame (the node's stamp of chunk step i); else None."""
        if stamp_ns in self._published:
            return int(stamp_ns), 0
        if not step_period_s or not self._published:
            return None
        oldest = next(iter(self._published))
        for index in range(1, max_steps):
            frame = int(stamp_ns) - round(index * step_period_s * 1e9)
            if frame < oldest:
                break
            if frame in self._published:
                return frame, index
        return None

    def first_answer_latency(self, stamp_ns: int, received_s: float) -> float | None:
        """Seconds from the frame's first publication to this answer; None when the stamp is
        unknown or the frame was answered before."""
        if stamp_ns not in self._published or stamp_ns in self._answered:
            return None
        self._answered.add(stamp_ns)
        return received_s - self._published[stamp_ns]


@dataclass(frozen=True)
class MatchedCommand:
    """One answer: the twist answering a published frame (stamped with the frame's stamp, or
    for step i of a chunk the frame's stamp + i control periods) and its gripper message."""

    stamp_ns: int               # the frame's stamp
    linear: tuple
    angular: tuple
    gripper_position: float
    step_index: int = 0         # the chunk step (0 for a single-step model)

    @property
    def is_finite(self) -> bool:
        return all(math.isfinite(v) for v in self.linear + self.angular
                   + (self.gripper_position,))


class AnswerPairs:
    """FIFOs of answering twists and of gripper messages for the node's whole life (module doc).

    Every twist whose stamp is a registered frame's (or, with `chunk_period_s`, a chunk step's
    of a registered frame) goes in, finite or not, and so does every gripper message (a NaN
    position for an unreadable one): dropping one side only would shift every later pair.
    `max_pending` bounds each FIFO (the oldest entries go first) in case one topic loses
    messages.
    """

    def __init__(self, registry: FrameRegistry, max_pending: int = 1024,
                 chunk_period_s: float | None = None):
        check_int('max_pending', max_pending, minimum=1)
        self.registry = registry
        self.chunk_period_s = chunk_period_s
        self._twists: deque = deque(maxlen=max_pending)   # (frame, step, linear, angular)
        self._grippers: deque = deque(maxlen=max_pending)   # positions

    def on_twist(self, stamp_ns: int, linear, angular) -> bool:
        """Queue a twist; True when it answers a registered frame (so a gripper follows it)."""
        located = self.registry.frame_of(stamp_ns, self.chunk_period_s)
        if located is None:
            return False                 # a hold: node-clock stamp, no gripper message
        self._twists.append(located + (tuple(float(v) for v in linear),
                                       tuple(float(v) for v in angular)))
        return True

    def on_gripper(self, position: float) -> None:
        self._grippers.append(float(position))

    def pop(self) -> list[MatchedCommand]:
        """Every complete pair received so far, oldest first."""
        pairs = []
        while self._twists and self._grippers:
            stamp_ns, index, linear, angular = self._twists.popleft()
            pairs.append(MatchedCommand(stamp_ns, linear, angular, self._grippers.popleft(),
                                        index))
        return pairs


__all__ = ['MAX_CHUNK_STEPS', 'next_stamp_ns', 'FrameRegistry', 'MatchedCommand', 'AnswerPairs']
