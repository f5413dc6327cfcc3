"""`vla-spec` on bad arguments, as a user types them (`cli.main` with the argument list, in
process: what the `vla-spec` script runs): each ends with one line naming the option or the
file and exit code 2, never a traceback. Before: an IndexError
(`bench --frames 0`), a ZeroDivisionError (`--streams 0`), a FileExistsError, torch's
RuntimeError (`fidelity --devices tpu`), a KeyError (`demo --report` of another JSON file),
`predict --repeat 0` printed nothing and exited 0, and a mistyped `--draft-path` was ignored
in the modes that do not draft."""
import pytest

from vla_spec_ros import cli


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
             'FILE': str(existing), 'EMPTY_JSON': str(empty), 'FULL': str(full)}
    try:
        code = cli.main([names.get(a, a) for a in args])
    except SystemExit as exc:                   # argparse's own refusal of an argument
        code = exc.code
    stderr = capsys.readouterr().err
    assert code == 2, (code, stderr[-2000:])
    assert words in stderr and 'Traceback' not in stderr, stderr[-2000:]
    assert not (tmp_path / 'out2-train').exists() and not (tmp_path / 'out').exists()
    assert [p.name for p in full.iterdir()] == ['training.json']
