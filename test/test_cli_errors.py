"""`vla-spec` on bad arguments, as a user types them (`cli.main` with the argument list, in
process: what the `vla-spec` script runs): each ends with one line naming the option or the
file and exit code 2, never a traceback. Before: an IndexError
(`bench --frames 0`), a ZeroDivisionError (`--streams 0`), a FileExistsError, torch's
RuntimeError (`fidelity --devices tpu`), a KeyError (`demo --report` of another JSON file),
`predict --repeat 0` printed nothing and exited 0, and a mistyped `--draft-path` was ignored
in the modes that do not draft. Later: torch's RuntimeError (`train-demo-vla --threads 0`,
`train-draft --device gpu`), an AttributeError (`--device cuda` without CUDA), Pillow's
UnidentifiedImageError (a corrupt frame for `fidelity --images`), a TypeError and a KeyError
(a safetensors header that is a JSON list, or lists a tensor without data_offsets), a
TypeError (a config.json's tower `patch_size: 16.0`)."""
import json
import struct
import types

import pytest

from vla_spec_ros import cli
from vla_spec_ros.assets import embedded_checkpoint


def _checkpoint_with(folder, header=None, tower_change=None):
    """The embedded model's config.json in ``folder``, with ``tower_change`` applied to its
    featurizer, and a model.safetensors of that JSON ``header`` (no tensor data)."""
    folder.mkdir()
    raw = json.loads((embedded_checkpoint('metaworld-demo') / 'config.json').read_text())
    raw['vla_spec_vision']['featurizer'].update(tower_change or {})
    (folder / 'config.json').write_text(json.dumps(raw))
    text = json.dumps(header if header is not None else {}).encode()
    (folder / 'model.safetensors').write_bytes(struct.pack('<Q', len(text)) + text)
    return str(folder)


def _bad_inputs(tmp_path) -> dict:
    """Files and folders the table's arguments name (each made for every case: cheap)."""
    bad_images = tmp_path / 'bad_images'
    bad_images.mkdir()
    (bad_images / 'frame.png').write_bytes(b'\x89PNG\r\n\x1a\n not really a png')
    return {
        'BAD_IMAGES': str(bad_images),
        'LIST_HEADER': _checkpoint_with(tmp_path / 'list_header', header=[1, 2]),
        'NO_OFFSETS': _checkpoint_with(tmp_path / 'no_offsets', header={
            'projector.fc1.weight': {'dtype': 'F32', 'shape': [2, 2]}}),
        'FLOAT_PATCH': _checkpoint_with(tmp_path / 'float_patch',
                                        tower_change={'patch_size': 16.0}),
    }


@pytest.mark.parametrize('args, words', [
    (['bench', '--frames', '0', '--modes', 'ar'], 'argument --frames: expected an integer >= 1'),
    (['bench', '--streams', '0'], 'argument --streams: expected an integer >= 1'),
    (['bench', '--warmup', '-1'], 'argument --warmup: expected an integer >= 0'),
    (['bench', '--sweep-inflight', 'a,b', '--modes', 'ar', '--frames', '1'],
     '--sweep-inflight: expected comma-separated integers'),
    (['predict', '--repeat', '0'], 'argument --repeat: expected an integer >= 1'),
    (['make-checkpoint', '--preset', 'tiny', '--out', 'OUT', '--max-shard-mb', '-1'],
     'argument --max-shard-mb: expected a number > 0'),
    (['make-checkpoint', '--preset', 'tiny', '--out', 'FILE'], 'File exists'),
    # A folder holding something (a trained checkpoint) is not written over without --force
    # (before: its weights were replaced by random ones, its training.json and draft/ kept).
    (['make-checkpoint', '--preset', 'tiny', '--out', 'FULL'], 'is not empty'),
    (['fidelity', '--devices', 'tpu', '--frames', '2'], "--devices: 'tpu'"),
    (['demo', '--report', 'EMPTY_JSON'], 'not a demo record'),
    (['demo', '--report', 'FILE'], 'not JSON'),
    # A draft path that cannot load is refused in a mode that does not draft too (before:
    # AR ran and the typo surfaced only when the mode was changed).
    (['predict', '--mode', 'ar', '--draft-path', 'OUT'], "draft_path: '"),
    (['predict', '--mode', 'pipeline', '--draft-path', 'previous_actoin'], 'does not exist'),
    (['predict', '--model', 'metaworld-demo-fast', '--draft-path', 'checkpoint'], 'has none'),
    # A --data folder without demonstrations (a typo) is refused, not collected into (15 min)
    # unless --collect-missing asks for it; nothing is written.
    (['train-demo-vla', '--data', 'OUT', '--out', 'OUT2'], 'holds no demonstrations'),
    # An infinite learning rate trained NaN weights and exited 0.
    (['train-demo-vla', '--data', 'OUT', '--out', 'OUT2', '--lr', 'inf'],
     'lr: must be a finite number > 0, got inf'),
    (['train-draft', '--model', 'tiny', '--data', 'FILE', '--out', 'OUT', '--lr', 'inf'],
     'lr: must be a finite number > 0, got inf'),
    # Refused before torch sees them (before: a RuntimeError or AttributeError traceback).
    (['train-demo-vla', '--data', 'OUT', '--out', 'OUT2', '--threads', '0'],
     'argument --threads: expected an integer >= 1'),
    (['train-draft', '--model', 'tiny', '--data', 'FILE', '--out', 'OUT', '--device', 'gpu'],
     "--device: 'gpu': expected \"cpu\" or \"cuda[:N]\""),
    (['train-draft', '--model', 'tiny', '--data', 'FILE', '--out', 'OUT', '--device',
      'cuda:99'], "--device: 'cuda:99'"),
    (['fidelity', '--images', 'BAD_IMAGES', '--devices', 'cpu'], 'cannot decode'),
    (['predict', '--model', 'LIST_HEADER'], 'a JSON list, not an object of tensors'),
    (['predict', '--model', 'NO_OFFSETS'], 'projector.fc1.weight has no valid data_offsets'),
    (['predict', '--model', 'FLOAT_PATCH'], 'patch_size: must be an integer >= 1, got 16.0'),
    # Options that were ignored or misread without a word.
    (['predict', '--relax-threshold', '5', '--mode', 'ar'], '--relax-threshold: 5 bins given'),
    (['predict', '--relax-threshold', '5', '--mode', 'pipeline'], 'spec and pipeline_spec'),
    (['fidelity', '--frame-size', '0'], 'argument --frame-size: expected an integer >= 1'),
    (['fidelity', '--dtypes', '', '--images', 'BAD_IMAGES'], '--dtypes: no dtype given'),
    (['fidelity', '--dtypes', 'float32,float33', '--images', 'BAD_IMAGES'],
     "--dtypes: unknown ['float33']"),
    (['bench', '--modes', ''], '--modes: no mode given'),
    (['bench', '--modes', ' , '], '--modes: no mode given'),
    (['train-draft', '--model', 'tiny', '--data', 'FILE', '--out', 'OUT', '--max-samples',
      '-1'], 'argument --max-samples: expected an integer >= 1'),
])
def test_a_bad_argument_ends_with_one_line_naming_it(tmp_path, capsys, args, words):
    existing = tmp_path / 'a_file.md'
    existing.write_text('not a record')
    empty = tmp_path / 'empty.json'
    empty.write_text('{}')
    full = tmp_path / 'full'
    full.mkdir()
    (full / 'training.json').write_text('{}')
    names = {'OUT': str(tmp_path / 'out'), 'OUT2': str(tmp_path / 'out2'),
             'FILE': str(existing), 'EMPTY_JSON': str(empty), 'FULL': str(full),
             **_bad_inputs(tmp_path)}
    try:
        code = cli.main([names.get(a, a) for a in args])
    except SystemExit as exc:                   # argparse's own refusal of an argument
        code = exc.code
    stderr = capsys.readouterr().err
    assert code == 2, (code, stderr[-2000:])
    assert words in stderr and 'Traceback' not in stderr, stderr[-2000:]
    assert words in stderr.strip().splitlines()[-1]             # the last line names it
    assert not (tmp_path / 'out2-train').exists() and not (tmp_path / 'out').exists()
    assert [p.name for p in full.iterdir()] == ['training.json']


@pytest.mark.parametrize('error', [RuntimeError('the device lost the frame\nat step 3'),
                                   OSError(28, 'No space left on device')])
def test_a_failure_while_running_ends_with_one_line(monkeypatch, capsys, error):
    """A frame that fails at inference (a RuntimeError) or a file that cannot be written (an
    OSError) ends the command with one line and exit code 2 (before: a traceback)."""
    from vla_spec_ros.policy import VLAPolicy

    def failing_policy(*args, **kwargs):
        def predict(*args, **kwargs):
            raise error
        return types.SimpleNamespace(model_config=types.SimpleNamespace(image_size=8),
                                     predict=predict)

    monkeypatch.setattr(VLAPolicy, 'from_pretrained', failing_policy)
    assert cli.main(['predict']) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('vla-spec predict: error: '), lines
    assert str(error).splitlines()[0] in lines[0]


def test_collect_demos_without_a_success_leaves_no_folder(tmp_path, capsys):
    """Before: a RuntimeError traceback, and an empty --out folder left behind."""
    from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason
    reason = sim_unavailable_reason()
    if reason is not None:
        pytest.skip(f'simulator: {reason}')
    out = tmp_path / 'demos'
    code = cli.main(['collect-demos', '--out', str(out), '--tasks', 'drawer-open',
                     '--episodes-per-task', '1', '--max-steps', '1', '--image-size', '16'])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and 'succeeded in none' in lines[-1] and 'Traceback' not in lines[-1]
    assert not out.exists()
