"""bench/paced_drafts.py's host parts: a row's summary (shares of frames decided in one and in
at most two forwards, p50 against AR's, tokens against AR's) and the observations it writes for
train-draft."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def paced_drafts():
    spec = importlib.util.spec_from_file_location('paced_drafts',
                                                  ROOT / 'bench' / 'paced_drafts.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_row_summary_counts_forwards_and_compares_tokens(paced_drafts):
    values = [(10.0, 1, (1, 2)), (20.0, 2, (3,)), (30.0, 5, (4,)), (40.0, 1, (5,))]
    reference = [(1, 2), (3,), (4,), (5,)]
    r = paced_drafts.row_summary(values, reference, ar_p50=50.0)
    assert r['ms_p50'] == pytest.approx(25.0) and r['p50_x_ar'] == pytest.approx(0.5)
    assert r['one_forward'] == pytest.approx(0.5) and r['at_most_two'] == pytest.approx(0.75)
    assert r['forwards_mean'] == pytest.approx(2.25) and r['tokens_equal_ar']
    assert not paced_drafts.row_summary(values, reference[::-1], 50.0)['tokens_equal_ar']


def test_observations_are_what_train_draft_reads(paced_drafts, tmp_path):
    rng = np.random.default_rng(0)
    frames = [SimpleNamespace(image=rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
                              instruction=f'task {i}') for i in range(3)]
    path = tmp_path / 'obs.npz'
    paced_drafts.write_observations(str(path), frames)
    from vla_spec_ros.train.draft_data import load_observations
    loaded = load_observations(str(path))
    assert len(loaded) == 3
    for frame, (image, instruction) in zip(frames, (loaded[i] for i in range(3))):
        assert np.array_equal(frame.image, image) and instruction == frame.instruction
