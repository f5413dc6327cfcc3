"""bench/paced_drafts.py's host parts: a row's summary (shares of frames decided in one and in
at most two forwards, p50 against AR's, tokens against AR's) and the observations it writes for
train-draft."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench_scripts import load_bench

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def paced_drafts():
    return load_bench('paced_drafts')


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


def test_run_frames_resets_numbers_the_steps_and_skips_the_warmup():
    import sys
    sys.path.insert(0, str(ROOT / 'bench'))
    from frame_runs import run_frames

    class Engine:
        def __init__(self):
            self.resets, self.submitted = 0, []

        def reset(self):
            self.resets += 1

        def submit(self, frame):
            self.submitted.append(frame)

        def run_until_idle(self):
            step = self.submitted[-1].control_step
            return [SimpleNamespace(result=SimpleNamespace(
                stats={'forward_passes': step % 3 + 1}, tokens=[step, step + 1]))]

    engine = Engine()
    frames = [SimpleNamespace(image=np.zeros((4, 4, 3), np.uint8), instruction='t')] * 6
    measured = run_frames(SimpleNamespace(engine=engine), frames, 'key', period_s=0.001,
                          warmup=2)
    assert engine.resets == 1
    assert [f.control_step for f in engine.submitted] == list(range(6))
    assert [(f, t) for _, f, t in measured] == [(s % 3 + 1, (s, s + 1)) for s in range(2, 6)]
    assert all(ms >= 0.0 for ms, _, _ in measured)


def test_a_positional_drafts_row_continues_its_drafts_by_position(paced_drafts):
    """The comparison row: its engine's drafters see the protocol's rule; a plain row keeps
    the FAST codec's continuation by coefficient. Each row loads its own codec."""
    from vla_spec_ros.engine.drafting.merged_chains import MergedChains
    plain = paced_drafts.load_row('metaworld-demo-fast', {'mode': 'spec'})
    positional = paced_drafts.load_row('metaworld-demo-fast',
                                       {'mode': 'spec', 'positional_drafts': True})
    assert not plain.engine.runner.codec.positional_drafts
    assert positional.engine.runner.codec.positional_drafts
    assert positional.engine.config.mode == 'spec'
    for policy in (plain, positional):
        drafter = policy.engine.strategy.drafter
        assert isinstance(drafter, MergedChains)
        previous = drafter.drafters[0]
        assert (previous._continue_draft is None) == (policy is positional)
