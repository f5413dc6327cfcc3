"""ROS 2 bags in the draft-training workflow: ``FrameRecorder`` writes them, ``bag_frames``
reads them back, ``vla-spec train-draft --bag`` trains on them.

Bags are written here (FrameRecorder in both storages; the rosbags writer directly for
CompressedImage, bgr8 with row padding, mono8, an unsupported encoding and an instruction
reset). The end-to-end check records a synthetic camera sequence (a square sliding across a
fixed scene, two instructions), trains a draft for the tiny random verifier on the even frames
through ``cli.main`` and loads it with ``VLAPolicy.from_pretrained(draft_path=...)``: on the
odd (held-out) frames its mean acceptance length, as the engine reports it, beats the random
head's, with the AR tokens unchanged.
"""
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('rosbags', reason='rosbags is not installed (pip install "rosbags>=0.11", '
                    'part of the [ros] extra): bag reading and recording cannot be tested')

import cv2  # noqa: E402
from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402
from test_train_draft import FAST  # noqa: E402

from vla_spec_ros import VLAPolicy, cli  # noqa: E402
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint  # noqa: E402
from vla_spec_ros.recording import FrameRecorder  # noqa: E402
from vla_spec_ros.train.bag_frames import BagFrames, load_bag_observations  # noqa: E402
from vla_spec_ros.train.draft_data import read_manifest  # noqa: E402

IMAGE, TEXT = '/camera/image', '/instruction'
SEC = 10 ** 9
TS = get_typestore(Stores.ROS2_KILTED)


def _frames(count, seed=0, shape=(6, 8, 3)):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(count)]


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


def _message_count(bag: Path, topic: str) -> int:
    from rosbags.highlevel import AnyReader
    with AnyReader([bag]) as reader:
        return sum(c.msgcount for c in reader.connections if c.topic == topic)


# ---- FrameRecorder -> BagFrames round trip ----------------------------------------------------

@pytest.mark.parametrize('storage', ['mcap', 'sqlite3'])
def test_recorded_pairs_read_back_exactly(tmp_path, storage):
    frames = _frames(9)
    texts = ['open the drawer'] * 4 + ['close the drawer'] * 3 + ['open the drawer'] * 2
    bag = tmp_path / 'bag'
    with FrameRecorder(bag, storage=storage, frame_id='cam') as rec:
        for i, (frame, text) in enumerate(zip(frames, texts)):
            assert rec.record(frame, text, 5 * SEC + i * SEC // 10)
        assert rec.frames_recorded == 9 and rec.instructions_recorded == 3
    assert rec.closed and (bag / 'metadata.yaml').is_file()
    assert len(list(bag.glob('*.mcap' if storage == 'mcap' else '*.db3'))) == 1
    assert _message_count(bag, TEXT) == 3                   # written only when it changes
    reader = BagFrames(bag, IMAGE, TEXT)
    pairs = list(reader)
    assert [t for _, t in pairs] == texts
    for (got, _), want in zip(pairs, frames):
        assert got.dtype == np.uint8 and np.array_equal(got, want)
    assert reader.stats.frames_yielded == 9 and reader.stats.skipped_no_instruction == 0
    # every_nth keeps paired frames 0, n, 2n, ...; max_frames stops early.
    obs = load_bag_observations(bag, IMAGE, TEXT, every_nth=4)
    assert len(obs) == 3 and [obs[i][1] for i in range(3)] == [texts[0], texts[4], texts[8]]
    assert np.array_equal(obs[1][0], frames[4])
    assert [t for _, t in BagFrames(bag, IMAGE, TEXT, every_nth=2, max_frames=2)] == \
        [texts[0], texts[2]]


def _write_raw_bag(path: Path) -> list:
    """sqlite3 bag by the rosbags writer; returns the expected (topic, frame, text) triples."""
    types = TS.types
    rgb = _frames(4, seed=3, shape=(5, 7, 3))
    with Writer(path, version=9, storage_plugin=StoragePlugin.SQLITE3) as writer:
        conns = {
            'compressed': writer.add_connection('/cam/compressed',
                                                'sensor_msgs/msg/CompressedImage', typestore=TS),
            'bgr': writer.add_connection('/cam/bgr', 'sensor_msgs/msg/Image', typestore=TS),
            'mono': writer.add_connection('/cam/mono', 'sensor_msgs/msg/Image', typestore=TS),
            'yuv': writer.add_connection('/cam/yuv', 'sensor_msgs/msg/Image', typestore=TS),
            'text': writer.add_connection(TEXT, 'std_msgs/msg/String', typestore=TS),
        }

        def header(t):
            return types['std_msgs/msg/Header'](
                stamp=types['builtin_interfaces/msg/Time'](sec=t // SEC, nanosec=t % SEC),
                frame_id='cam')

        def image(t, array, encoding, padding=0):
            rows = array.reshape(array.shape[0], -1)
            rows = np.concatenate([rows, np.full((rows.shape[0], padding), 0xAB, np.uint8)], 1)
            return types['sensor_msgs/msg/Image'](
                header=header(t), height=array.shape[0], width=array.shape[1],
                encoding=encoding, is_bigendian=0, step=rows.shape[1], data=rows.reshape(-1))

        def write(name, t, msg):
            writer.write(conns[name], t, TS.serialize_cdr(msg, msg.__msgtype__))

        # t = 1, 2, 3, 4 s: frames; instructions at 1.5 s ('push'), 2.5 s ('' = none) and
        # 3 s ('pull', same time as frame 3: in force for it).
        for t, text in ((1.5, 'push the button'), (2.5, ''), (3, 'pull the lever')):
            write('text', int(t * SEC), types['std_msgs/msg/String'](data=text))
        for i, array in enumerate(rgb):
            t = (i + 1) * SEC
            png = cv2.imencode('.png', array[:, :, ::-1])[1].reshape(-1)
            write('compressed', t, types['sensor_msgs/msg/CompressedImage'](
                header=header(t), format='rgb8; png compressed bgr8', data=png))
            write('bgr', t, image(t, np.ascontiguousarray(array[:, :, ::-1]), 'bgr8', 3))
            write('mono', t, image(t, np.ascontiguousarray(array[:, :, :1]), 'mono8'))
            write('yuv', t, image(t, array[:, :, :2].copy(), 'yuv422'))
    return [(rgb[1], 'push the button'), (rgb[2], 'pull the lever'), (rgb[3], 'pull the lever')]


def test_compressed_bgr8_and_mono8_bags_decode(tmp_path):
    bag = tmp_path / 'raw'
    expected = _write_raw_bag(bag)
    for topic in ('/cam/compressed', '/cam/bgr'):
        reader = BagFrames(bag, topic, TEXT)
        pairs = list(reader)
        assert [t for _, t in pairs] == [t for _, t in expected], topic
        for (got, _), (want, _) in zip(pairs, expected):
            assert np.array_equal(got, want), topic          # PNG lossless, padding skipped
        # frame 0 precedes every instruction; frame 1 (t=2 s) has 'push'; the empty string at
        # 2.5 s is in force at no frame because 'pull' arrives with frame 2.
        assert reader.stats.images_read == 4 and reader.stats.skipped_no_instruction == 1
    mono = [f for f, _ in BagFrames(bag, '/cam/mono', TEXT)]
    assert np.array_equal(mono[0], np.repeat(expected[0][0][:, :, :1], 3, axis=2))
    # The bare storage file reads too.
    assert len(list(BagFrames(next(bag.glob('*.db3')), '/cam/bgr', TEXT))) == 3


def _write_simple_bag(path: Path, images, texts) -> None:
    """MCAP bag by the rosbags writer: ``images`` (t ns, 1-pixel value) as rgb8 on IMAGE and
    ``texts`` (t ns, str) on TEXT."""
    types = TS.types
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        text_conn = writer.add_connection(TEXT, 'std_msgs/msg/String', typestore=TS)
        image_conn = writer.add_connection(IMAGE, 'sensor_msgs/msg/Image', typestore=TS)
        for t, data in texts:
            writer.write(text_conn, t, TS.serialize_cdr(types['std_msgs/msg/String'](data=data),
                                                        'std_msgs/msg/String'))
        for t, value in images:
            msg = types['sensor_msgs/msg/Image'](
                header=types['std_msgs/msg/Header'](
                    stamp=types['builtin_interfaces/msg/Time'](sec=0, nanosec=t), frame_id=''),
                height=1, width=1, encoding='rgb8', is_bigendian=0, step=3,
                data=np.array([value] * 3, np.uint8))
            writer.write(image_conn, t, TS.serialize_cdr(msg, 'sensor_msgs/msg/Image'))


def test_empty_instruction_means_none_in_force(tmp_path):
    bag = tmp_path / 'bag'
    _write_simple_bag(bag, [(t, t) for t in range(6)], [(0, 'wave'), (2, ''), (4, 'wave again')])
    reader = BagFrames(bag, IMAGE, TEXT)
    pairs = [(int(f[0, 0, 0]), t) for f, t in reader]
    assert pairs == [(0, 'wave'), (1, 'wave'), (4, 'wave again'), (5, 'wave again')]
    assert reader.stats.skipped_no_instruction == 2


# ---- FrameRecorder: rate and size bounds ------------------------------------------------------

def test_rate_limit_and_time_order(tmp_path):
    frames = _frames(20)
    bag = tmp_path / 'bag'
    with FrameRecorder(bag, min_period_s=0.05) as rec:
        kept = [rec.record(f, 'open the drawer' if i < 10 else 'close it', i * SEC // 100)
                for i, f in enumerate(frames)]               # 100 Hz camera, 20 Hz recording
        assert kept == [i % 5 == 0 for i in range(20)]
        assert not rec.record(frames[0], 'open the drawer', 0)       # older than the last
        assert not rec.record(frames[0], '', SEC)                    # no instruction
        assert rec.frames_recorded == 4 and rec.instructions_recorded == 2
    assert not rec.record(frames[0], 'x', 10 * SEC)                  # closed
    rec.close()                                                      # idempotent
    pairs = list(BagFrames(bag, IMAGE, TEXT))
    assert [t for _, t in pairs] == ['open the drawer'] * 2 + ['close it'] * 2
    assert all(np.array_equal(f, frames[5 * i]) for i, (f, _) in enumerate(pairs))


@pytest.mark.parametrize('storage', ['mcap', 'sqlite3'])
def test_size_bound(tmp_path, storage):
    frame = _frames(1, shape=(40, 50, 3))[0]
    budget = 200_000 if storage == 'mcap' else 240_000
    bag = tmp_path / 'bag'
    with FrameRecorder(bag, max_bytes=budget, storage=storage) as rec:
        results = [rec.record(frame, f'step {i // 3}', i) for i in range(40)]
        assert rec.is_full and rec.bytes_used <= budget
        first_refused = results.index(False)
        assert first_refused > 5
        assert all(results[:first_refused]) and not any(results[first_refused:])
        assert not rec.record(frame[:1, :1], 'tiny', 100)           # full stays full
    assert _disk_bytes(bag) <= budget
    assert len(list(BagFrames(bag, IMAGE, TEXT))) == rec.frames_recorded == first_refused


def test_recorder_rejects_bad_arguments(tmp_path):
    (tmp_path / 'exists').mkdir()
    cases = [({'directory': tmp_path / 'exists'}, 'directory'),
             ({'storage': 'rosbag1'}, 'storage'),
             ({'min_period_s': -1}, 'min_period_s'),
             ({'max_bytes': 100}, 'max_bytes'),
             ({'image_topic': 'camera'}, 'image_topic'),
             ({'instruction_topic': IMAGE}, 'instruction_topic')]
    for options, field in cases:
        options = {'directory': tmp_path / 'new', **options}
        with pytest.raises(ValueError, match=field):
            FrameRecorder(options.pop('directory'), **options)
        assert not (tmp_path / 'new').exists()
    with FrameRecorder(tmp_path / 'ok') as rec:
        for frame, field in ((np.zeros((4, 4), np.uint8), 'frame_rgb'),
                             (np.zeros((4, 4, 3), np.float32), 'frame_rgb')):
            with pytest.raises(ValueError, match=field):
                rec.record(frame, 'x', 0)
        with pytest.raises(ValueError, match='stamp_ns'):
            rec.record(np.zeros((4, 4, 3), np.uint8), 'x', -1)
        with pytest.raises(ValueError, match='instruction'):
            rec.record(np.zeros((4, 4, 3), np.uint8), None, 0)


# ---- BagFrames: bad input -------------------------------------------------------------------

def test_bad_bags_give_clear_errors(tmp_path):
    bag = tmp_path / 'raw'
    _write_raw_bag(bag)
    with pytest.raises(ValueError, match='does not exist'):
        BagFrames(tmp_path / 'missing', IMAGE, TEXT)
    (tmp_path / 'not_a_bag').mkdir()
    with pytest.raises(ValueError, match='metadata.yaml'):
        BagFrames(tmp_path / 'not_a_bag', IMAGE, TEXT)
    (tmp_path / 'not_a_bag' / 'metadata.yaml').write_text('rosbag2_bagfile_information: 7\n')
    with pytest.raises(ValueError, match='not_a_bag is not a readable rosbag2 recording'):
        BagFrames(tmp_path / 'not_a_bag', IMAGE, TEXT)
    with pytest.raises(ValueError, match=r"image_topic: topic '/camera/image' is not in the "
                       r'bag; it has /cam/bgr \(sensor_msgs/msg/Image\)'):
        BagFrames(bag, IMAGE, TEXT)
    with pytest.raises(ValueError, match='instruction_topic: .*not in the bag.*/cam/mono'):
        BagFrames(bag, '/cam/bgr', '/task')
    with pytest.raises(ValueError, match="instruction_topic: topic '/cam/bgr' carries "
                       'sensor_msgs/msg/Image; expected std_msgs/msg/String'):
        BagFrames(bag, '/cam/mono', '/cam/bgr')
    with pytest.raises(ValueError, match='image_topic: .* carries std_msgs/msg/String'):
        BagFrames(bag, TEXT, TEXT)
    with pytest.raises(ValueError, match="/cam/yuv message 2 .*encoding: 'yuv422' is not "
                       'supported'):
        list(BagFrames(bag, '/cam/yuv', TEXT))
    for option, value in (('every_nth', 0), ('max_frames', 0)):
        with pytest.raises(ValueError, match=option):
            BagFrames(bag, '/cam/bgr', TEXT, **{option: value})
    empty = tmp_path / 'empty'
    with FrameRecorder(empty):
        pass
    with pytest.raises(ValueError, match=r'no frame of /camera/image could be paired.*0 images '
                       r'read.*/instruction has no messages'):
        list(BagFrames(empty, IMAGE, TEXT))
    # Every frame precedes the first instruction (recording started before the task was set).
    early = tmp_path / 'early'
    _write_simple_bag(early, [(1, 1), (2, 2)], [(7, 'too late')])
    with pytest.raises(ValueError, match=r'no frame of /camera/image could be paired .*2 images '
                       r'read, 2 with no instruction in force; the first instruction is at '
                       r't=7 ns'):
        list(BagFrames(early, IMAGE, TEXT))


# ---- vla-spec train-draft --bag ---------------------------------------------------------------

def _scene(i: int, count: int) -> np.ndarray:
    """A yellow square sliding left to right across a fixed scene (56 x 56, tiny's size)."""
    image = np.zeros((56, 56, 3), np.uint8)
    image[:, :, 0], image[:, :, 2] = 40, 90
    x = int(4 + 40 * i / count)
    image[20:32, x:x + 12] = (220, 200, 30)
    return image


def _acceptance_length(model: str, draft: str, frames) -> float:
    """Mean accepted tokens per verify step (as ``vla-spec bench`` reports it), spec mode,
    r = 0; the tokens must equal AR's."""
    spec = VLAPolicy.from_pretrained(model, mode='spec', draft_path=draft)
    ar = VLAPolicy.from_pretrained(model)
    lengths = []
    for image, text in frames:
        result = spec.predict(image, text, 'bridge_orig')
        assert result.tokens == ar.predict(image, text, 'bridge_orig').tokens
        lengths += result.stats['accepted_lengths']
    return float(np.mean(lengths))


def test_train_draft_from_a_recorded_bag(tmp_path, capsys):
    model = str(make_checkpoint('tiny', tmp_path / 'tiny', seed=0))
    count = 32
    texts = ['pick up the red block', 'open the top drawer']
    frames = [(_scene(i, count), texts[2 * i // count]) for i in range(count)]
    train, held_out = frames[0::2], frames[1::2]
    bag = tmp_path / 'bag'
    with FrameRecorder(bag, min_period_s=0.1) as rec:
        for i, (image, text) in enumerate(train):
            assert rec.record(image, text, 10 * SEC + i * SEC // 10)
    obs = load_bag_observations(bag, IMAGE, TEXT)               # what --bag trains on
    assert len(obs) == len(train)
    assert all(np.array_equal(obs[i][0], image) and obs[i][1] == text
               for i, (image, text) in enumerate(train))

    out = tmp_path / 'draft'
    argv = ['train-draft', '--model', model, '--bag', str(bag), '--image-topic', IMAGE,
            '--instruction-topic', TEXT, '--out', str(out), '--steps', '120', *FAST]
    assert cli.main(argv) == 0, capsys.readouterr().err
    settings = read_manifest(out / 'train' / 'data')['settings']
    assert settings['bag'] == str(bag.resolve()) and settings['image_topic'] == IMAGE
    random_len = _acceptance_length(model, 'random', held_out)
    trained_len = _acceptance_length(model, str(out), held_out)
    print(f'held-out acceptance length: random head {random_len:.2f}, '
          f'trained on the bag {trained_len:.2f}')
    assert trained_len >= random_len + 0.5


def test_train_draft_bag_command_line_errors(tmp_path, capsys):
    model = str(make_checkpoint('tiny', tmp_path / 'tiny', seed=0))
    common = ['train-draft', '--model', model, '--out', str(tmp_path / 'out'), '--steps', '1']
    with pytest.raises(SystemExit) as info:                      # one source only
        cli.main(common + ['--data', 'x.npz', '--bag', str(tmp_path)])
    assert info.value.code == 2 and 'not allowed with' in capsys.readouterr().err
    assert cli.main(common + ['--data', 'x.npz', '--image-topic', IMAGE]) == 2
    assert '--image-topic: only applies with --bag' in capsys.readouterr().err
    assert cli.main(common + ['--bag', str(tmp_path / 'missing')]) == 2
    assert 'does not exist' in capsys.readouterr().err
    bag = tmp_path / 'bag'
    with FrameRecorder(bag) as rec:
        rec.record(_frames(1)[0], 'x', 0)
    assert cli.main(common + ['--bag', str(bag), '--image-topic', '/cam']) == 2
    assert "image_topic: topic '/cam' is not in the bag" in capsys.readouterr().err
