"""Bounded ROS 2 bag recording of what the VLA node sees: camera frames and the instruction.

``FrameRecorder`` writes a rosbag2 directory (MCAP or SQLite 3 storage, both written by the
pure-Python ``rosbags`` package; no ROS installation, no rclpy, no torch) holding

    <image_topic>        sensor_msgs/msg/Image, rgb8, one per recorded frame
    <instruction_topic>  std_msgs/msg/String, written when the instruction changes and again
                         at the start of every split file

Every message is logged at the frame's stamp (``stamp_ns``, also the image's header stamp), and
the instruction is written just before the frame that first uses it, so a reader that pairs
each frame with the latest instruction at or before its time (``train.bag_frames``) gets back
exactly the recorded (frame, instruction) pairs. ``vla-spec train-draft --bag`` reads such bags
(and bags from ``ros2 bag record`` of the same topics).

Contracts:
- Rate: at most one frame per ``min_period_s`` of stamp time; a frame stamped before the last
  recorded one is not recorded (the bag stays in time order).
- Size: ``bytes_used`` is a conservative estimate of the bag's size on disk (a fixed container
  allowance per split file, then per message its serialised bytes plus the storage's
  per-message overhead).
  A frame (with its instruction) whose cost would take ``bytes_used`` past ``max_bytes`` is not
  recorded, and from then on ``is_full`` is True and nothing more is recorded.
- Splits (``split_s``): the bag is a series of files, ``<name>_0.mcap``, ``<name>_1.mcap``,
  ... as ``ros2 bag record --max-bag-duration`` writes them. A split that holds messages is
  closed once it has been open ``split_s`` seconds (checked on every ``record`` and by
  ``close_split_if_due``, which the node calls from a timer so that a camera that stopped does
  not keep its last split open); each closed split is a complete file (index and summary
  written) and ``metadata.yaml`` is rewritten (atomically: a temporary file renamed) to list
  every closed split. A process killed (SIGKILL, a crash) therefore leaves a bag that standard
  readers (rosbags' ``AnyReader``, the ``mcap`` package's reader, ``vla-spec train-draft
  --bag``; rosbag2's own reader takes the same layout) read up to its last closed split: about
  the last ``split_s`` seconds are lost. Files are not fsynced: a power loss may also lose what
  the operating system had not written yet. The open split is written in
  ``.<name>_<k>.open/`` and moved next to the others when it closes; a killed process leaves
  that folder behind, unlisted.
  Each split is readable on its own: it starts with the instruction in force.
  ``split_s=None`` writes one file, closed by ``close()`` only (a killed process then leaves
  no readable bag).
- The bag is complete after ``close()`` (or leaving the ``with`` block): the open split is
  closed and ``metadata.yaml`` written. ``close()`` is idempotent.
- Storage: ``'mcap'`` (the default, as in ``ros2 bag record`` since Iron) or ``'sqlite3'``.
- One lock guards every method, so a worker thread may record while another thread closes.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from io import StringIO
from pathlib import Path

import numpy as np

from vla_spec_ros.validation import check_number

DEFAULT_IMAGE_TOPIC = '/camera/image'
DEFAULT_INSTRUCTION_TOPIC = '/instruction'
IMAGE_TYPE = 'sensor_msgs/msg/Image'
STRING_TYPE = 'std_msgs/msg/String'
STORAGES = ('mcap', 'sqlite3')
EXTENSIONS = {'mcap': '.mcap', 'sqlite3': '.db3'}
ROSBAG2_VERSION = 9

# Size model per storage: (fixed container allowance, per-message overhead, allocation unit).
# MCAP: header, schemas, channels, summary, metadata.yaml; per message a 31-byte record, a
# 16-byte index entry and, for frames of 1 MiB or more (one chunk each), the chunk's ~220 bytes
# of framing and index. SQLite: the schema pages and metadata.yaml; per message a row, its
# timestamp index entry, and blob overflow pages filled to at most page size - 4 bytes.
_SIZE_MODEL = {
    'mcap': (8192, 256, 1),
    'sqlite3': (40960, 96, 4092),
}
_SQLITE_PAGE = 4096


def _rosbags():
    try:
        from rosbags.rosbag2 import StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore
    except ImportError as exc:
        raise ImportError('FrameRecorder needs the rosbags package: pip install '
                          '"rosbags>=0.11" (or this package\'s [ros] extra)') from exc
    return StoragePlugin, Writer, get_typestore(Stores.ROS2_KILTED)


class FrameRecorder:
    """Records (frame, instruction) pairs into a new rosbag2 directory; see the module doc.

    ``clock`` (seconds, monotonic) times the splits; tests pass their own."""

    def __init__(self, directory, *, min_period_s: float = 0.0, max_bytes: int | None = None,
                 storage: str = 'mcap', image_topic: str = DEFAULT_IMAGE_TOPIC,
                 instruction_topic: str = DEFAULT_INSTRUCTION_TOPIC, frame_id: str = '',
                 split_s: float | None = None, clock=time.monotonic):
        path = Path(directory).expanduser()
        if path.exists():
            raise ValueError(f'directory: {path} exists already; a bag is written into a new '
                             'directory')
        if storage not in STORAGES:
            raise ValueError(f'storage: {storage!r} is not one of {STORAGES}')
        min_period_s = check_number('min_period_s', min_period_s, minimum=0.0, unit='s')
        if split_s is not None:
            split_s = check_number('split_s', split_s, above=0.0, unit='s')
        for name, topic in (('image_topic', image_topic),
                            ('instruction_topic', instruction_topic)):
            if not isinstance(topic, str) or not topic.startswith('/') or topic.endswith('/'):
                raise ValueError(f'{name}: {topic!r} is not an absolute topic name')
        if image_topic == instruction_topic:
            raise ValueError(f'instruction_topic: must differ from image_topic ({image_topic})')
        self._reserve, self._per_message, self._unit = _SIZE_MODEL[storage]
        if max_bytes is not None and (isinstance(max_bytes, bool) or int(max_bytes) != max_bytes
                                      or max_bytes <= self._reserve):
            raise ValueError(f'max_bytes: must be an integer above the {storage} container '
                             f'allowance of {self._reserve} bytes (or None), got {max_bytes}')
        self._plugin, self._writer_cls, self._typestore = _rosbags()
        self.path = path
        self.storage = storage
        self.image_topic, self.instruction_topic = image_topic, instruction_topic
        self.frame_id = str(frame_id)
        self.min_period_ns = int(round(float(min_period_s) * 1e9))
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self.split_s = split_s
        self._clock = clock
        self.bytes_used = 0
        self.frames_recorded = 0
        self.instructions_recorded = 0
        self.files: list[str] = []          # closed splits, as listed in metadata.yaml
        self._split_info: list[dict] = []   # their rosbag2 metadata
        self._is_full = False
        self._last_stamp: int | None = None
        self._last_instruction: str | None = None
        self._lock = threading.Lock()
        self._writer = None
        path.mkdir(parents=True)
        try:
            self._open_split()
        except Exception:
            shutil.rmtree(path, ignore_errors=True)
            raise

    # ---- state --------------------------------------------------------------------------------

    @property
    def is_full(self) -> bool:
        """True once a frame was refused because it would exceed ``max_bytes``."""
        return self._is_full

    @property
    def closed(self) -> bool:
        return self._writer is None

    @property
    def last_stamp_ns(self) -> int | None:
        """The stamp of the last frame recorded (None: none yet); an earlier one is not."""
        return self._last_stamp

    # ---- splits -------------------------------------------------------------------------------

    def _split_name(self, index: int) -> str:
        return f'{self.path.name}_{index}'

    def _open_split(self) -> None:
        """A new split in its hidden folder (a rosbags bag of its own until it is closed)."""
        index = len(self.files)
        folder = self.path / f'.{self._split_name(index)}.open'
        writer = self._writer_cls(folder, version=ROSBAG2_VERSION,
                                  storage_plugin=getattr(self._plugin, self.storage.upper()))
        writer.open()
        try:
            self._image_conn = writer.add_connection(self.image_topic, IMAGE_TYPE,
                                                     typestore=self._typestore)
            self._text_conn = writer.add_connection(self.instruction_topic, STRING_TYPE,
                                                    typestore=self._typestore)
        except Exception:
            writer.close()
            raise
        self._writer, self._split_folder = writer, folder
        self._split_messages = 0
        self._split_opened = self._clock()
        self.bytes_used += self._reserve

    def _close_split(self, *, keep_empty: bool) -> None:
        """Close the open split; move its file next to the others and list it in
        metadata.yaml (an empty split only with ``keep_empty``: the bag's only file)."""
        writer, folder, self._writer = self._writer, self._split_folder, None
        writer.close()
        if not self._split_messages and not keep_empty:
            shutil.rmtree(folder, ignore_errors=True)
            return
        name = self._split_name(len(self.files)) + EXTENSIONS[self.storage]
        info = _load_yaml(folder / 'metadata.yaml')['rosbag2_bagfile_information']
        os.replace(folder / (folder.name + EXTENSIONS[self.storage]), self.path / name)
        self.files.append(name)
        self._split_info.append(info)
        self._write_metadata()
        shutil.rmtree(folder, ignore_errors=True)

    def _write_metadata(self) -> None:
        """metadata.yaml listing every closed split, replaced atomically."""
        infos = self._split_info
        starts = [i['starting_time']['nanoseconds_since_epoch'] for i in infos
                  if i['message_count']]
        ends = [i['starting_time']['nanoseconds_since_epoch'] + i['duration']['nanoseconds']
                for i in infos if i['message_count']]
        start = min(starts) if starts else infos[0]['starting_time']['nanoseconds_since_epoch']
        topics: dict = {}
        for info in infos:
            for entry in info['topics_with_message_count']:
                name = entry['topic_metadata']['name']
                if name in topics:
                    topics[name]['message_count'] += entry['message_count']
                else:
                    topics[name] = {'topic_metadata': dict(entry['topic_metadata']),
                                    'message_count': entry['message_count']}
        files = []
        for name, info in zip(self.files, infos):
            entry = dict(info['files'][0])
            entry['path'] = name
            files.append(entry)
        merged = dict(infos[0])
        merged.update({
            'relative_file_paths': list(self.files),
            'duration': {'nanoseconds': max(ends) - start if ends else 0},
            'starting_time': {'nanoseconds_since_epoch': start},
            'message_count': sum(i['message_count'] for i in infos),
            'topics_with_message_count': list(topics.values()),
            'files': files,
        })
        _dump_yaml(self.path / 'metadata.yaml', {'rosbag2_bagfile_information': merged})

    def _roll_if_due(self) -> None:
        if (self._writer is not None and self.split_s is not None and self._split_messages
                and self._clock() - self._split_opened >= self.split_s):
            self._close_split(keep_empty=False)
            self._open_split()
            self._last_instruction = None      # each split starts with the instruction

    def close_split_if_due(self) -> bool:
        """Close the open split when it holds messages and has been open ``split_s``
        seconds (a new one opens); returns whether it did."""
        with self._lock:
            count = len(self.files)
            self._roll_if_due()
            return len(self.files) > count

    # ---- recording ----------------------------------------------------------------------------

    def _cost(self, payload_bytes: int) -> int:
        """Estimated bytes on disk of one message with ``payload_bytes`` serialised bytes."""
        size = payload_bytes + self._per_message
        if self._unit > 1 and payload_bytes > self._unit // 4:     # SQLite overflow pages
            size = -(-size // self._unit) * _SQLITE_PAGE
        return size

    def _image_message(self, frame: np.ndarray, stamp_ns: int):
        types = self._typestore.types
        sec, nanosec = divmod(stamp_ns, 10**9)
        stamp = types['builtin_interfaces/msg/Time'](sec=sec, nanosec=nanosec)
        header = types['std_msgs/msg/Header'](stamp=stamp, frame_id=self.frame_id)
        height, width = frame.shape[:2]
        return types[IMAGE_TYPE](header=header, height=height, width=width, encoding='rgb8',
                                 is_bigendian=0, step=width * 3,
                                 data=np.ascontiguousarray(frame).reshape(-1))

    def record(self, frame_rgb: np.ndarray, instruction: str, stamp_ns: int) -> bool:
        """Record one frame seen under ``instruction`` at ``stamp_ns`` (ns since the epoch of
        the node's clock). Returns whether it was recorded: False when closed, full, within
        ``min_period_s`` of the last recorded frame, stamped before it, or when the
        instruction is empty (the node holds then: nothing to learn from). Raises ValueError
        naming the argument for a frame that is not (H, W, 3) uint8 or a bad stamp."""
        frame = np.asarray(frame_rgb)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3 \
                or 0 in frame.shape:
            raise ValueError(f'frame_rgb: expected (H, W, 3) uint8 RGB, got {frame.shape} '
                             f'{frame.dtype}')
        if not isinstance(instruction, str):
            raise ValueError(f'instruction: expected str, got {type(instruction).__name__}')
        if isinstance(stamp_ns, bool) or not isinstance(stamp_ns, (int, np.integer)) \
                or stamp_ns < 0:
            raise ValueError(f'stamp_ns: expected an integer >= 0, got {stamp_ns!r}')
        stamp_ns = int(stamp_ns)
        with self._lock:
            if self._writer is None or self._is_full or not instruction:
                return False
            if self._last_stamp is not None and (
                    stamp_ns < self._last_stamp
                    or stamp_ns - self._last_stamp < self.min_period_ns):
                return False
            self._roll_if_due()
            image = self._typestore.serialize_cdr(self._image_message(frame, stamp_ns),
                                                  IMAGE_TYPE)
            text = None
            if instruction != self._last_instruction:
                text = self._typestore.serialize_cdr(
                    self._typestore.types[STRING_TYPE](data=instruction), STRING_TYPE)
            cost = self._cost(len(image)) + (self._cost(len(text)) if text is not None else 0)
            if self.max_bytes is not None and self.bytes_used + cost > self.max_bytes:
                self._is_full = True
                return False
            if text is not None:
                self._writer.write(self._text_conn, stamp_ns, text)
                self._last_instruction = instruction
                self.instructions_recorded += 1
                self._split_messages += 1
            self._writer.write(self._image_conn, stamp_ns, image)
            self._split_messages += 1
            self.bytes_used += cost
            self.frames_recorded += 1
            self._last_stamp = stamp_ns
            return True

    def close(self) -> None:
        """Close the open split and finish metadata.yaml. Safe to call more than once."""
        with self._lock:
            if self._writer is not None:
                self._close_split(keep_empty=not self.files)

    def __enter__(self) -> 'FrameRecorder':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f'FrameRecorder({str(self.path)!r}, storage={self.storage!r}, '
                f'frames={self.frames_recorded}, files={len(self.files)}, '
                f'bytes_used={self.bytes_used}, full={self._is_full})')


def _load_yaml(path: Path) -> dict:
    from ruamel.yaml import YAML
    return YAML(typ='safe').load(path.read_text('utf8'))


def _dump_yaml(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it (a reader, or a
    process killed meanwhile, sees the old file or the new one, never a part)."""
    from ruamel.yaml import YAML
    yaml = YAML(typ='safe')
    yaml.default_flow_style = False
    text = StringIO()
    yaml.dump(data, text)
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(text.getvalue(), 'utf8')
    os.replace(tmp, path)
