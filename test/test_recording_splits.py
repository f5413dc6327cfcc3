"""FrameRecorder's split files: a killed recording process loses its last split only.

A bag recorded with ``split_s`` is a series of complete files listed by ``metadata.yaml``,
rewritten as each split closes. Checked: splits close on time (on ``record`` and on
``close_split_if_due``), every split is readable on its own (it starts with the instruction),
the bag reads back whole after ``close()``, and a process recording in a loop and killed with
SIGKILL leaves a bag that rosbags' ``AnyReader``, the ``mcap`` package's reader (where
installed) and ``train-draft --bag``'s reader (``BagFrames``) read up to its last closed split:
every frame recorded more than ``split_s`` before the kill, in order, with its pixels.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('rosbags', reason='rosbags is not installed (the [ros] extra)')

from vla_spec_ros.recording import FrameRecorder  # noqa: E402
from vla_spec_ros.train.bag_frames import BagFrames  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IMAGE, TEXT = '/camera/image', '/instruction'
SEC = 10 ** 9


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _frame(i: int) -> np.ndarray:
    """Frame i: its index in the first pixels, the rest a fixed pattern."""
    frame = np.full((12, 16, 3), i % 251, np.uint8)
    frame[0, 0] = (i // 65536 % 256, i // 256 % 256, i % 256)
    return frame


def _index(frame: np.ndarray) -> int:
    r, g, b = (int(v) for v in frame[0, 0])
    return r * 65536 + g * 256 + b


def _stamps(bag: Path, topic: str = IMAGE) -> list:
    from rosbags.highlevel import AnyReader
    with AnyReader([bag]) as reader:
        conns = [c for c in reader.connections if c.topic == topic]
        return [t for _, t, _ in reader.messages(connections=conns)]


@pytest.mark.parametrize('storage', ['mcap', 'sqlite3'])
def test_splits_close_on_time_and_read_back_whole(tmp_path, storage):
    clock = FakeClock()
    bag = tmp_path / 'bag'
    rec = FrameRecorder(bag, storage=storage, split_s=1.0, clock=clock)
    texts = ['open the drawer'] * 7 + ['close the drawer'] * 5
    for i, text in enumerate(texts):
        clock.now = 0.25 * i                      # 4 frames a second
        assert rec.record(_frame(i), text, 5 * SEC + i * SEC // 4)
    # Frames 0-3, 4-7 closed on the frames at t = 1.0 and 2.0; frames 8-11 still open.
    ext = '.mcap' if storage == 'mcap' else '.db3'
    assert rec.files == [f'bag_0{ext}', f'bag_1{ext}']
    assert [t for _, t in BagFrames(bag, IMAGE, TEXT)] == texts[:8]    # readable meanwhile
    assert not rec.close_split_if_due()           # open for 0.75 s only
    clock.now = 3.0
    assert rec.close_split_if_due()               # a timer closes it: no frame needed
    assert not rec.close_split_if_due()           # the new split is empty: nothing to close
    rec.close()
    assert rec.files == [f'bag_{k}{ext}' for k in range(3)]
    assert sorted(p.name for p in bag.iterdir()) == rec.files + ['metadata.yaml']
    pairs = list(BagFrames(bag, IMAGE, TEXT))
    assert [_index(f) for f, _ in pairs] == list(range(12))
    assert [t for _, t in pairs] == texts
    for i, (frame, _) in enumerate(pairs):
        np.testing.assert_array_equal(frame, _frame(i))
    assert _stamps(bag) == [5 * SEC + i * SEC // 4 for i in range(12)]
    # Each split starts with the instruction in force: readable on its own.
    assert rec.instructions_recorded == 4          # 3 split starts + 1 change
    for k, name in enumerate(rec.files):
        single = tmp_path / f'single_{k}'
        single.mkdir()
        os.link(bag / name, single / name)
        frames = list(BagFrames(single / name, IMAGE, TEXT))
        assert [_index(f) for f, _ in frames] == list(range(4 * k, 4 * k + 4))


def test_without_splits_one_file_and_an_empty_bag_stays_readable(tmp_path):
    clock = FakeClock()
    with FrameRecorder(tmp_path / 'one', clock=clock) as rec:
        for i in range(5):
            clock.now = 100.0 * i
            assert rec.record(_frame(i), 'wave', i * SEC)
        assert rec.files == []                     # nothing closed before close()
    assert rec.files == ['one_0.mcap']
    assert len(list(BagFrames(tmp_path / 'one', IMAGE, TEXT))) == 5
    with FrameRecorder(tmp_path / 'empty', split_s=0.5, clock=clock) as rec:
        clock.now += 10.0
        assert not rec.close_split_if_due()
    assert rec.files == ['empty_0.mcap']           # topics listed, no messages
    assert _stamps(tmp_path / 'empty') == []
    with pytest.raises(ValueError, match='split_s'):
        FrameRecorder(tmp_path / 'bad', split_s=0.0)
    assert not (tmp_path / 'bad').exists()


def test_size_bound_counts_every_split(tmp_path):
    clock = FakeClock()
    bag = tmp_path / 'bag'
    frame = _frame(0).repeat(4, axis=0).repeat(4, axis=1)    # 48 x 64
    with FrameRecorder(bag, max_bytes=150_000, split_s=1.0, clock=clock) as rec:
        results = []
        for i in range(60):
            clock.now = 0.5 * i
            results.append(rec.record(frame, 'wave', i * SEC))
        assert rec.is_full and rec.bytes_used <= 150_000 and len(rec.files) > 3
    assert sum(p.stat().st_size for p in bag.rglob('*') if p.is_file()) <= 150_000
    assert len(list(BagFrames(bag, IMAGE, TEXT))) == rec.frames_recorded == sum(results)


# ---- a recording process killed with SIGKILL ---------------------------------------------------

SPLIT_S = 0.4
RECORDING_SCRIPT = textwrap.dedent('''
    import json, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from test_recording_splits import _frame
    from vla_spec_ros.recording import FrameRecorder
    rec = FrameRecorder(sys.argv[1], split_s=float(sys.argv[3]))
    i = 0
    while True:
        text = 'open the drawer' if i < 40 else 'close the drawer'
        if rec.record(_frame(i), text, 10**18 + i * 10**7):
            print(json.dumps({'i': i, 't': time.monotonic(), 'files': len(rec.files)}),
                  flush=True)
        i += 1
        time.sleep(0.01)
''')


def test_a_killed_recording_keeps_all_but_its_last_split(tmp_path):
    bag = tmp_path / 'bag'
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    process = subprocess.Popen([sys.executable, '-c', RECORDING_SCRIPT, str(bag),
                                str(ROOT / 'test'), str(SPLIT_S)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    recorded = []
    try:
        for line in process.stdout:                # runs until 4 splits are closed
            recorded.append(json.loads(line))
            if recorded[-1]['files'] >= 4 and recorded[-1]['i'] > 60:
                break
        else:
            raise AssertionError(process.stderr.read())
        process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    # Before the kill every frame was printed; at most the last split's frames are missing.
    expected = [r['i'] for r in recorded]
    must_have = [r['i'] for r in recorded if r['t'] < killed_at - SPLIT_S - 0.5]
    assert len(must_have) > 20

    # train-draft --bag's reader (rosbags' AnyReader on the directory's metadata.yaml).
    pairs = list(BagFrames(bag, IMAGE, TEXT))
    got = [_index(frame) for frame, _ in pairs]
    assert got == expected[:len(got)]              # in order, nothing invented or skipped
    assert set(must_have) <= set(got)
    for frame, text in pairs:
        np.testing.assert_array_equal(frame, _frame(_index(frame)))
        assert text == ('open the drawer' if _index(frame) < 40 else 'close the drawer')
    # The open split was left behind, unlisted.
    assert [p.name for p in bag.iterdir() if p.name.endswith('.open')]

    # Each listed file with the mcap package's own reader, where it is installed.
    try:
        from mcap.reader import make_reader
    except ImportError:
        return
    import yaml
    info = yaml.safe_load((bag / 'metadata.yaml').read_text())['rosbag2_bagfile_information']
    stamps = []
    for name in info['relative_file_paths']:
        with open(bag / name, 'rb') as stream:
            reader = make_reader(stream)
            assert reader.get_summary() is not None        # a complete, indexed file
            stamps += [message.log_time for _, channel, message
                       in reader.iter_messages(topics=[IMAGE])]
    assert stamps == [10 ** 18 + i * 10 ** 7 for i in got]
