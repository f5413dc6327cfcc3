"""bench/fast_drafts.py's host parts: which frames a stride keeps, and the table."""
import numpy as np

from bench_scripts import load_bench
from vla_spec_ros.engine.result import Frame


def _module():
    return load_bench('fast_drafts')


def frames(steps):
    image = np.zeros((4, 4, 3), np.uint8)
    return [Frame(image, 'x', None, 's', control_step=s) for s in steps]


def test_a_stride_keeps_every_kth_step_of_each_run():
    fd = _module()
    steps = [5, 6, 7, 8, 9, 1000, 1001, 1002, 1003, 2000]
    kept = [f.control_step for f in fd.strided(frames(steps), 2)]
    assert kept == [5, 7, 9, 1000, 1002, 2000]
    assert [f.control_step for f in fd.strided(frames(steps), 1)] == steps


def test_the_table_puts_each_row_against_hf_of_its_stride():
    fd = _module()
    base = dict(acceptance_length=1.0, frame_forwards_per_chunk=10.0, forwards_per_action=10.0,
                tokens_per_action=10.0, draft='-')
    rows = [dict(base, stride=1, mode='hf', ms_per_chunk=100.0, latency_p50_ms=100.0,
                 forwards_per_action=float('nan')),
            dict(base, stride=1, mode='spec', draft='shifted_chunk', acceptance_length=4.0,
                 frame_forwards_per_chunk=2.5, ms_per_chunk=25.0, latency_p50_ms=30.0,
                 max_inflight=1)]
    table = fd.format_table(rows)
    spec_row = ('| 1 | spec | shifted_chunk | 1 | 4.00 | 2.50 | 10.00 | 10.0 | 25.0 | 30.0 '
                '| 4.00 | 0.30 |')
    assert spec_row in table
    assert '| 1 | hf | - |' in table and '| - |' in table
