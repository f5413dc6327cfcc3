"""``vla-spec fidelity`` (vla_spec_ros/fidelity.py): the stage-by-stage report on a couple of
frames, and its bin distance histogram."""
import json

import numpy as np
from PIL import Image

from vla_spec_ros import cli
from vla_spec_ros.fidelity import bin_histogram


def test_fidelity_command_on_image_files(tmp_path, capsys):
    rng = np.random.default_rng(0)
    images = tmp_path / 'frames'
    images.mkdir()
    Image.fromarray(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(images / 'a.png')
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(images / 'b.png')
    (images / 'notes.txt').write_text('not a frame')
    out = tmp_path / 'report'
    assert cli.main(['fidelity', '--images', str(images), '--devices', 'cpu',
                     '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    assert '| engine path, cpu | 0 | 0.00 % | 0 / 2 |' in printed
    result = json.loads((out / 'fidelity.json').read_text())
    assert result['model'] == 'metaworld-demo' and result['frames'] == 2
    assert result['frame_sizes'] == ['120x90', '64x64']
    assert result['pixels']['engine path, cpu']['max_levels'] == 0
    # The float one-pass resize is off somewhere on the 120 x 90 frame, never on the other.
    assert result['pixels']['one-pass float64 bicubic (before)']['frames_differing'] == 1
    runs = {(r['device'], r['dtype']): r for r in result['runs']}
    assert set(runs) == {('cpu', 'float32'), ('cpu', 'bfloat16')}
    assert runs['cpu', 'float32']['features']['max'] < 1e-5
    assert runs['cpu', 'bfloat16']['features']['max'] > runs['cpu', 'float32']['features']['max']
    for run in runs.values():
        assert sum(run['tokens']['total'].values()) == 2 * 7
        assert all(sum(d.values()) == 2 for d in run['tokens']['per_dim'])
    readme = (out / 'README.md').read_text()
    assert readme.startswith('# Fidelity: metaworld-demo') and 'vla-spec fidelity' in readme


def test_bin_histogram_counts_distances_per_dimension():
    first, last = 100, 355                  # 256 action tokens
    reference = [(100, 200, 355), (150, 150, 150)]
    ours = [(100, 201, 352), (150, 20, 150)]        # 0, 1, 3+ ; 0, out of range, 0
    h = bin_histogram(ours, reference, first, last)
    assert h['total'] == {'0': 3, '1': 1, '2': 0, '3+': 2}
    assert h['per_dim'][1] == {'0': 0, '1': 1, '2': 0, '3+': 1}
    assert h['frames_exact'] == 0 and h['frames'] == 2
    assert bin_histogram([(20, 101)], [(20, 103)], first, last)['total'] == \
        {'0': 1, '1': 0, '2': 1, '3+': 0}           # the same stray token on both sides
