"""The ``vla-spec`` command through ``vla_spec_ros.cli.main``: make-checkpoint, predict (also on
an image file and on a preset name), bench with JSON + markdown output and ratios against the
Hugging Face baseline, and exit code 2 with the error on stderr for bad input.
"""
import contextlib
import io
import json
import re

import numpy as np
import pytest
import torch

from vla_spec_ros import cli
from vla_spec_ros.policy import VLAPolicy


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp('cli') / 'tiny'
    assert cli.main(['make-checkpoint', '--preset', 'tiny', '--out', str(out),
                     '--seed', '4']) == 0
    return out


def _tokens(stdout: str) -> list[list[int]]:
    return [json.loads(m) for m in re.findall(r'tokens (\[[0-9, ]*\])', stdout)]


def test_make_checkpoint(checkpoint, capsys):
    for name in ('config.json', 'model.safetensors', 'tokenizer.json',
                 'dataset_statistics.json'):
        assert (checkpoint / name).is_file(), name
    out = checkpoint.parent / 'sharded'
    assert cli.main(['make-checkpoint', '--preset', 'tiny', '--out', str(out), '--seed', '4',
                     '--max-shard-mb', '0.5']) == 0
    assert str(out) in capsys.readouterr().out
    assert (out / 'model.safetensors.index.json').is_file()
    assert len(list(out.glob('model-*.safetensors'))) >= 2


def test_make_checkpoint_replaces_a_checkpoint_only_with_force(tmp_path, capsys):
    """A trained checkpoint's folder is refused; with --force its weights are replaced and
    what described them (training report, demonstrations, draft head, a shard index that
    would be read before the new model.safetensors) is removed."""
    out = tmp_path / 'trained'
    assert cli.main(['make-checkpoint', '--preset', 'tiny', '--out', str(out),
                     '--max-shard-mb', '0.25']) == 0
    for name in ('training.json', 'demos_manifest.json', 'vla_spec_node.json'):
        (out / name).write_text('{}')
    (out / 'draft').mkdir()
    (out / 'draft' / 'config.json').write_text('{}')
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert cli.main(['make-checkpoint', '--preset', 'pi0fast-tiny', '--out', str(out)]) == 2
    assert '--force' in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert cli.main(['make-checkpoint', '--preset', 'pi0fast-tiny', '--out', str(out),
                     '--force']) == 0
    left = {p.name for p in out.iterdir()}
    assert not left & {'training.json', 'demos_manifest.json', 'vla_spec_node.json', 'draft',
                       'model.safetensors.index.json'}
    assert not list(out.glob('model-*.safetensors'))
    policy = VLAPolicy.from_pretrained(str(out))
    assert type(policy.engine.runner.model).__name__ == 'Pi0Fast'


def test_make_checkpoint_rejects_unknown_preset(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(['make-checkpoint', '--preset', 'huge', '--out', str(tmp_path / 'x')])
    assert info.value.code == 2
    assert 'huge' in capsys.readouterr().err


def test_predict_with_unnorm_key(checkpoint, capsys):
    code = cli.main(['predict', '--model', str(checkpoint), '--unnorm-key', 'libero_goal',
                     '--restrict-to-action-tokens', '--repeat', '2', '--instruction',
                     'open the drawer'])
    assert code == 0
    out = capsys.readouterr().out
    tokens = _tokens(out)
    assert len(tokens) == 2 and tokens[0] == tokens[1] and len(tokens[0]) == 7
    assert 'libero_goal' in out and 'valid True' in out


def test_predict_reads_an_rgb_image_file(checkpoint, tmp_path, capsys):
    cv2 = pytest.importorskip('cv2')
    rgb = np.random.default_rng(9).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    rgb[:, :40] = (255, 0, 0)                 # a red half: a channel swap would change it
    path = tmp_path / 'frame.png'
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert cli.main(['predict', '--model', str(checkpoint), '--image', str(path),
                     '--unnorm-key', 'bridge_orig', '--dtype', 'float64']) == 0
    printed = _tokens(capsys.readouterr().out)[0]
    policy = VLAPolicy.from_pretrained(str(checkpoint), dtype='float64')
    assert printed == list(policy.predict(rgb, 'open the drawer', 'bridge_orig').tokens)


def test_predict_on_a_preset_builds_it_once_in_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('VLA_SPEC_CACHE', str(tmp_path / 'cache'))
    args = ['predict', '--model', 'tiny', '--unnorm-key', 'bridge_orig']
    assert cli.main(args) == 0
    folder = tmp_path / 'cache' / 'presets' / 'tiny-seed0'
    assert (folder / 'config.json').is_file()
    stamp = (folder / 'model.safetensors').stat().st_mtime_ns
    first = _tokens(capsys.readouterr().out)
    assert cli.main(args) == 0
    assert _tokens(capsys.readouterr().out) == first
    assert (folder / 'model.safetensors').stat().st_mtime_ns == stamp      # not rebuilt


def test_bad_unnorm_key_exits_2(checkpoint, capsys):
    code = cli.main(['predict', '--model', str(checkpoint), '--unnorm-key', 'libero_10'])
    assert code == 2
    captured = capsys.readouterr()
    assert 'libero_10' in captured.err and 'bridge_orig' in captured.err
    assert 'libero_goal' in captured.err and 'tokens' not in captured.out


def test_missing_unnorm_key_with_two_datasets_exits_2(checkpoint, capsys):
    assert cli.main(['predict', '--model', str(checkpoint)]) == 2
    assert 'unnorm_key' in capsys.readouterr().err


def test_missing_model_folder_exits_2(tmp_path, capsys):
    absent = tmp_path / 'no-such-checkpoint'
    assert cli.main(['predict', '--model', str(absent)]) == 2
    assert 'no-such-checkpoint' in capsys.readouterr().err


BENCH_ARGS = ['--modes', 'hf,ar,pipeline', '--frames', '4', '--warmup', '1']


@pytest.fixture(scope='module')
def bench_run(checkpoint, tmp_path_factory):
    """One bench run shared by the bench tests: (exit code, stdout, argv, output folder)."""
    out_dir = tmp_path_factory.mktemp('bench') / 'results'
    argv = ['bench', '--model', str(checkpoint)] + BENCH_ARGS + ['--out', str(out_dir)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(argv)
    return code, stdout.getvalue(), argv, out_dir


def _bench_record(out_dir):
    json_files = list(out_dir.glob('*.json'))
    assert len(json_files) == 1
    return json.loads(json_files[0].read_text())


def _quiet_bench(checkpoint, tmp_path, *options) -> dict:
    """``vla-spec bench --model CHECKPOINT OPTIONS --out ...`` (stdout swallowed): must exit
    0; returns its JSON record."""
    out_dir = tmp_path / 'results'
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(['bench', '--model', str(checkpoint), *options,
                         '--out', str(out_dir)]) == 0
    return _bench_record(out_dir)


def test_bench_writes_json_and_markdown(bench_run):
    code, table, _, out_dir = bench_run
    assert code == 0
    md_files = list(out_dir.glob('*.md'))
    assert len(md_files) == 1
    record = _bench_record(out_dir)
    rows = {row['mode']: row for row in record['rows']}
    assert [row['mode'] for row in record['rows']] == ['hf', 'ar', 'pipeline']
    assert record['num_frames'] == 4 and record['warmup'] == 1
    assert record['frame_source'] == 'random'
    assert record['environment']['torch'] == torch.__version__
    assert rows['hf']['ratio_vs_hf'] == pytest.approx(1.0)
    for mode in ('ar', 'pipeline'):
        row = rows[mode]
        assert row['num_actions'] == 4
        assert row['actions_per_s'] > 0 and row['latency_p50_ms'] > 0
        assert row['latency_p99_ms'] >= row['latency_p50_ms']
        assert row['ratio_vs_hf'] == pytest.approx(row['actions_per_s']
                                                   / rows['hf']['actions_per_s'])
    assert rows['ar']['forwards_per_action'] == pytest.approx(7.0)
    # 4 frames after warmup through a 7-token pipeline: (4 + 6) forwards / 4 actions at most.
    assert rows['pipeline']['forwards_per_action'] <= (4 + 6) / 4 + 1e-9
    markdown = md_files[0].read_text()
    for mode in ('hf', 'ar', 'pipeline'):
        assert re.search(rf'^\| {mode} \|', markdown, re.M), mode
        assert re.search(rf'^\| {mode} \|', table, re.M), mode


def test_bench_records_the_command_it_ran(bench_run):
    # The results file must name the command that produced it, also when main() is called
    # with an explicit argv (as here) rather than from the console script.
    _, _, argv, out_dir = bench_run
    record = _bench_record(out_dir)
    assert record['command'] == 'vla-spec ' + ' '.join(argv)


def test_bench_rejects_unknown_mode(checkpoint, capsys):
    assert cli.main(['bench', '--model', str(checkpoint), '--modes', 'hf,turbo']) == 2
    assert 'turbo' in capsys.readouterr().err


@pytest.mark.parametrize('options, words', [
    (['--modes', 'hf,ar,spec', '--draft-path', 'MISSING'], 'does not exist'),
    (['--modes', 'hf,ar,spec', '--draft-path', 'EMPTY'], 'model.safetensors'),
    (['--modes', 'hf,pipeline', '--max-prefills-per-step', '3', '--max-inflight', '2'],
     'max_prefills_per_step'),
])
def test_bench_checks_every_row_before_timing_any(checkpoint, tmp_path, monkeypatch, capsys,
                                                  options, words):
    """Before: a bad --draft-path surfaced only at its mode's row, after the rows before it
    (the HF baseline, AR) had been timed."""
    from vla_spec_ros import bench
    timed = []
    monkeypatch.setattr(bench, 'bench_hf', lambda *args: timed.append('hf'))
    monkeypatch.setattr(bench, 'bench_engine', lambda *args: timed.append('engine'))
    (tmp_path / 'empty').mkdir()
    names = {'MISSING': str(tmp_path / 'missing'), 'EMPTY': str(tmp_path / 'empty')}
    code = cli.main(['bench', '--model', str(checkpoint), '--frames', '1', '--warmup', '0',
                     *[names.get(o, o) for o in options]])
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert timed == []


def test_bench_frame_sources():
    from vla_spec_ros.bench import make_frames
    frames = make_frames(5, 32, seed=3, unnorm_key='k', num_streams=2)
    assert [f.image.shape for f in frames] == [(32, 32, 3)] * 5
    assert [f.stream_id for f in frames] == ['stream0', 'stream1'] * 2 + ['stream0']
    with pytest.raises(ValueError, match='frame source'):
        make_frames(5, 32, seed=3, unnorm_key='k', source='camera')


def test_bench_passes_the_tree_options_to_the_speculative_modes(checkpoint, tmp_path):
    record = _quiet_bench(checkpoint, tmp_path, '--modes', 'spec', '--frames', '2',
                          '--warmup', '1', '--draft-path', 'random', '--tree-depth', '3',
                          '--tree-min-prob', '0.5')
    assert record['tree'] == {'tree_depth': 3, 'tree_min_prob': 0.5}
    # a random head is unsure of everything: at 0.5 every tree is the root alone
    assert record['rows'][0]['forwards_per_action'] == pytest.approx(7.0)


def test_bench_merges_the_previous_action_into_the_draft_trees(checkpoint, tmp_path):
    record = _quiet_bench(checkpoint, tmp_path, '--modes', 'spec', '--frames', '2',
                          '--warmup', '1', '--draft-path', 'random', '--draft-previous-action')
    assert record['tree'] == {'draft_previous_action': True}
    assert record['rows'][0]['num_actions'] == 2


def test_bench_two_streams_admit_two_frames_per_step(checkpoint, tmp_path):
    """``--streams 2 --max-prefills-per-step 2 --max-inflight 14``: each stream has a frame
    waiting whenever its last one was admitted, so every step while frames remain admits
    two: 8 frames take 4 admitting steps plus the 6-step drain."""
    record = _quiet_bench(checkpoint, tmp_path, '--modes', 'pipeline', '--frames', '8',
                          '--warmup', '2', '--streams', '2', '--max-prefills-per-step', '2',
                          '--max-inflight', '14')
    assert (record['num_streams'], record['max_prefills_per_step'],
            record['max_inflight']) == (2, 2, 14)
    row = record['rows'][0]
    assert row['num_actions'] == 8
    assert row['forwards_per_action'] == pytest.approx((8 / 2 + 6) / 8)
    # Requests per step: pair k (admitted in step k, k = 0..3) takes part in steps k..k+6,
    # so steps 0..9 carry 2, 4, 6, 8, 8, 8, 8, 6, 4, 2 requests.
    assert row['inflight_per_step'] == pytest.approx(56 / 10)


# ---- make-checkpoint: a pi0-FAST test checkpoint of other cameras and state ------------------

@pytest.fixture(scope='module')
def two_camera_fast(tmp_path_factory):
    out = tmp_path_factory.mktemp('cli') / 'fast2'
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(['make-checkpoint', '--preset', 'pi0fast-tiny', '--out', str(out),
                         '--seed', '5', '--image-slots', '2', '--image-size', '42',
                         '--state-dim', '6', '--decodable-chunks']) == 0
    return out, stdout.getvalue()


def test_make_checkpoint_writes_the_cameras_image_size_and_state(two_camera_fast):
    out, stdout = two_camera_fast
    config = json.loads((out / 'config.json').read_text())
    visual = {k: v['shape'] for k, v in config['input_features'].items()
              if v['type'] == 'VISUAL'}
    assert list(visual.values()) == [[3, 42, 42], [3, 42, 42]]
    assert config['input_features']['observation.state']['shape'] == [6]
    assert config['image_resolution'] == [42, 42]
    assert 'test aid' in stdout and 'FAST frame' in stdout
    policy = VLAPolicy.from_pretrained(str(out))
    model = policy.engine.runner.model
    assert (model.num_image_slots, model.cfg.state_dim, model.image_size) == (2, 6, 42)


@pytest.mark.parametrize('mode', ['ar', 'pipeline_spec'])
def test_a_decodable_checkpoint_gives_valid_chunks_for_two_cameras_and_a_state(
        two_camera_fast, mode):
    out, _ = two_camera_fast
    recorded = json.loads((out / 'vla_spec_pi0fast.json').read_text())['decodable']
    policy = VLAPolicy.from_pretrained(str(out), mode=mode)
    rng = np.random.default_rng(2)
    for _ in range(4):
        images = tuple(rng.integers(0, 256, (42, 42, 3), dtype=np.uint8) for _ in range(2))
        result = policy.predict(images, 'pick up the red cup', state=rng.normal(size=6))
        assert result.is_valid, result.invalid_reason
        assert list(result.tokens) == recorded['frame']
        assert result.normalized.shape == (4, 3)
        assert np.array_equal(result.normalized, np.array(recorded['chunk']))
        assert np.isfinite(result.action).all() and result.action.shape == (4, 3)
    with pytest.raises(ValueError, match='state'):       # the checkpoint reads 6 values
        policy.predict(images, 'pick up the red cup', state=np.zeros(4))


@pytest.mark.parametrize('argv, text', [
    (['--preset', 'tiny', '--image-slots', '2'], '--image-slots: only pi0fast-* presets'),
    (['--preset', 'tiny', '--decodable-chunks'], '--decodable-chunks: only pi0fast-* presets'),
    (['--preset', 'pi0fast-tiny', '--image-slots', '0'], '--image-slots: must be >= 1'),
    (['--preset', 'pi0fast-tiny', '--state-dim', '-2'], '--state-dim: must be >= 1'),
    (['--preset', 'pi0fast-tiny', '--image-size', '10'], 'image_size'),
])
def test_make_checkpoint_refuses_options_its_preset_cannot_take(tmp_path, capsys, argv, text):
    assert cli.main(['make-checkpoint', '--out', str(tmp_path / 'x'), *argv]) == 2
    assert text in capsys.readouterr().err


def test_predict_on_a_reasoning_model_prints_what_it_wrote(capsys):
    """A reasoning policy's text is most of its output: predict prints it (before: the tokens
    and a NaN action only, nothing saying what the model planned)."""
    assert cli.main(['predict', '--model', 'metaworld-demo-reason', '--seed', '3']) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith('reasoning'))
    policy = VLAPolicy.from_pretrained('metaworld-demo-reason')
    image = cli._load_image(None, policy.model_config.image_size, 3)
    reasoning = policy.predict(image, 'open the drawer').reasoning
    assert reasoning.text and repr(reasoning.text) in line
    assert f'({reasoning.num_tokens} tokens)' in line
