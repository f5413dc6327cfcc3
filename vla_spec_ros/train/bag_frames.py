"""ROS 2 bags -> (frame, instruction) observations for draft-head training.

Reads a rosbag2 recording (a directory with ``metadata.yaml``, or a bare ``.mcap`` / ``.db3``
file; MCAP and SQLite 3 storage) with the pure-Python ``rosbags`` package: no ROS installation.
Such bags come from ``ros2 bag record <image topic> <instruction topic>`` or from
``vla_spec_ros.recording.FrameRecorder``.

Contracts of ``BagFrames``:
- Image topic: sensor_msgs/msg/Image (the encodings the node accepts: rgb8, bgr8, rgba8, bgra8,
  mono8 and their 16-bit forms; ``step`` padding honoured) or sensor_msgs/msg/CompressedImage
  (JPEG / PNG). Both are decoded by the node's own converters (``image_messages``), so the
  training frames are the arrays the node would feed the model.
- Instruction topic: std_msgs/msg/String. An empty string means no instruction in force.
- Time is the bag's log time of each message (String has no header). Frames are yielded in
  log-time order, each paired with the latest instruction logged at or before it; frames with
  no instruction in force are skipped and counted (``stats.skipped_no_instruction``).
- ``every_nth`` keeps paired frames 0, n, 2n, ...; ``max_frames`` stops after that many.
- Bad input raises ValueError naming the problem: missing bag, topic not in the bag (the
  available topics are listed), wrong message type, unsupported encoding, no frame paired.

``load_bag_observations`` returns the ``draft_data.ObservationSet`` that ``load_observations``
returns for an ``obs.npz``, so ``train-draft --bag`` shares all of training with ``--data``.
"""
from __future__ import annotations

import bisect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

IMAGE_TYPES = ('sensor_msgs/msg/Image', 'sensor_msgs/msg/CompressedImage')
STRING_TYPE = 'std_msgs/msg/String'


@dataclass
class BagFrameStats:
    images_read: int = 0                # image messages read, in time order
    frames_yielded: int = 0
    skipped_no_instruction: int = 0     # images with no (non-empty) instruction in force
    skipped_every_nth: int = 0          # paired frames dropped by every_nth


@contextmanager
def _open_reader(path: Path):
    """An open rosbags ``AnyReader`` of ``path``; its own errors become ValueError."""
    try:
        from rosbags.highlevel import AnyReader
        from rosbags.typesys import Stores, get_typestore
    except ImportError as exc:
        raise ImportError('reading ROS 2 bags needs the rosbags package: pip install '
                          '"rosbags>=0.11" (or this package\'s [ros] extra)') from exc
    try:
        # Bags recorded without message definitions (rosbag2 before Iron) need a typestore.
        reader = AnyReader([path], default_typestore=get_typestore(Stores.ROS2_KILTED))
        reader.open()
    except Exception as exc:                # rosbags' reader errors, unreadable metadata
        raise ValueError(f'bag: {path} is not a readable rosbag2 recording ({exc})') from exc
    try:
        yield reader
    finally:
        reader.close()


def _decode_image(msg, msgtype: str) -> np.ndarray:
    from ..image_messages import compressed_to_rgb, image_to_rgb
    if msgtype == IMAGE_TYPES[1]:
        return compressed_to_rgb(msg)
    return image_to_rgb(msg)


class BagFrames:
    """Iterable of (frame (H, W, 3) uint8 RGB, instruction) pairs from one bag.

    The constructor checks the bag, the topics and their types and reads the instructions
    (small); each iteration reads the image topic once and refreshes ``stats``.
    """

    def __init__(self, bag: str | os.PathLike, image_topic: str, instruction_topic: str, *,
                 every_nth: int = 1, max_frames: int | None = None):
        self.path = Path(bag).expanduser()
        if not self.path.exists():
            raise ValueError(f'bag: {self.path} does not exist')
        if self.path.is_dir() and not (self.path / 'metadata.yaml').is_file():
            raise ValueError(f'bag: {self.path} has no metadata.yaml; expected a rosbag2 '
                             'directory (or pass its .mcap / .db3 file)')
        if isinstance(every_nth, bool) or not isinstance(every_nth, int) or every_nth < 1:
            raise ValueError(f'every_nth: must be an integer >= 1, got {every_nth!r}')
        if max_frames is not None and (isinstance(max_frames, bool)
                                       or not isinstance(max_frames, int) or max_frames < 1):
            raise ValueError(f'max_frames: must be an integer >= 1 or None, got {max_frames!r}')
        self.image_topic, self.instruction_topic = image_topic, instruction_topic
        self.every_nth, self.max_frames = every_nth, max_frames
        self.stats = BagFrameStats()
        with _open_reader(self.path) as reader:
            image_conns = self._connections(reader, 'image_topic', image_topic, IMAGE_TYPES)
            text_conns = self._connections(reader, 'instruction_topic', instruction_topic,
                                           (STRING_TYPE,))
            self.image_type = image_conns[0].msgtype
            texts = [(t, reader.deserialize(raw, c.msgtype).data)
                     for c, t, raw in reader.messages(connections=text_conns)]
        # (log time, instruction) in time order; the order of equal times is the bag's.
        texts.sort(key=lambda item: item[0])
        self._text_times = [t for t, _ in texts]
        self._texts = [str(text) for _, text in texts]

    @staticmethod
    def _connections(reader, field: str, topic: str, types: tuple[str, ...]) -> list:
        found = [c for c in reader.connections if c.topic == topic]
        if not found:
            available = sorted({f'{c.topic} ({c.msgtype})' for c in reader.connections})
            raise ValueError(f'{field}: topic {topic!r} is not in the bag; it has '
                             f'{", ".join(available) or "no topics"}')
        carried = sorted({c.msgtype for c in found})
        if len(carried) > 1 or carried[0] not in types:
            raise ValueError(f'{field}: topic {topic!r} carries {", ".join(carried)}; '
                             f'expected {" or ".join(types)}')
        return found

    def instruction_at(self, time_ns: int) -> str:
        """The instruction in force at ``time_ns`` ('' when none)."""
        index = bisect.bisect_right(self._text_times, time_ns) - 1
        return self._texts[index] if index >= 0 else ''

    def __iter__(self) -> Iterator[tuple[np.ndarray, str]]:
        stats = self.stats = BagFrameStats()
        paired = 0
        with _open_reader(self.path) as reader:
            conns = [c for c in reader.connections if c.topic == self.image_topic]
            for conn, time_ns, raw in reader.messages(connections=conns):
                stats.images_read += 1
                instruction = self.instruction_at(time_ns)
                if not instruction:
                    stats.skipped_no_instruction += 1
                    continue
                paired += 1
                if (paired - 1) % self.every_nth:
                    stats.skipped_every_nth += 1
                    continue
                msg = reader.deserialize(raw, conn.msgtype)
                try:
                    frame = _decode_image(msg, conn.msgtype)
                except ValueError as exc:
                    raise ValueError(f'{self.image_topic} message {stats.images_read} '
                                     f'(t={time_ns} ns) of {self.path}: {exc}') from exc
                stats.frames_yielded += 1
                yield frame, instruction
                if self.max_frames is not None and stats.frames_yielded >= self.max_frames:
                    return
        if stats.frames_yielded == 0:
            first = (f'the first instruction is at t={self._text_times[0]} ns'
                     if self._text_times else f'{self.instruction_topic} has no messages')
            raise ValueError(f'bag: no frame of {self.image_topic} could be paired with an '
                             f'instruction ({stats.images_read} images read, '
                             f'{stats.skipped_no_instruction} with no instruction in force; '
                             f'{first})')


def load_bag_observations(bag: str | os.PathLike, image_topic: str, instruction_topic: str, *,
                          every_nth: int = 1, max_frames: int | None = None):
    """All paired frames of ``bag`` in memory as a ``draft_data.ObservationSet``."""
    from .draft_data import ObservationSet
    frames = BagFrames(bag, image_topic, instruction_topic, every_nth=every_nth,
                       max_frames=max_frames)
    items = list(frames)
    s = frames.stats
    source = (f'{frames.path} ({image_topic}, {instruction_topic}: {s.frames_yielded} frames of '
              f'{s.images_read}; {s.skipped_no_instruction} before any instruction, '
              f'{s.skipped_every_nth} by every_nth)')
    return ObservationSet(items, source)
