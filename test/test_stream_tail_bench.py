"""bench/stream_tail.py's host parts: a row's mode and engine options from the command line,
and each answered frame's latency split into the engine's record and the node's stages (a
chunked model's later steps answering the same frame counted once)."""
import math

import pytest

from bench_scripts import load_bench


@pytest.fixture(scope='module')
def stream_tail():
    return load_bench('stream_tail')


def test_a_row_is_a_mode_or_a_labelled_mode_with_options():
    records = load_bench('records')
    assert records.parse_row('ar') == ('ar', {'mode': 'ar'})
    assert records.parse_row('ps1=pipeline_spec:max_inflight_per_stream=1:'
                             'speculative_prefill=false:tree_min_prob=0.3') == (
        'ps1', {'mode': 'pipeline_spec', 'max_inflight_per_stream': 1,
                'speculative_prefill': False, 'tree_min_prob': 0.3})


def test_a_rows_node_parameters_are_taken_out_of_its_policy_options(stream_tail):
    options = {'mode': 'pipeline_spec', 'node.torch_threads': 2, 'tree_depth': 4}
    assert stream_tail.split_node_parameters(options) == {'torch_threads': 2}
    assert options == {'mode': 'pipeline_spec', 'tree_depth': 4}
    assert stream_tail.split_node_parameters({'mode': 'ar'}) == {}


class Recorder:
    def __init__(self, frames):
        self.frames = frames


class NoPauses:
    def within(self, t0, t1):
        return 0.0


def record(submit, start, end, receipt, forwards=3):
    return {'submit': submit, 'start': start, 'end': end, 'forwards': forwards, 'tokens': 9,
            'prefill_accepted': 0, 'valid': True, 'receipt': receipt, 'taken': receipt + 0.001,
            'converted': receipt + 0.002}


def test_each_frame_is_split_into_the_engine_and_the_node_stages(stream_tail):
    a, b, warm = (10, 0), (10, 100_000_000), (9, 900_000_000)      # stamps 0.1 s apart
    trace = {'published': {a: 1.000, b: 1.100}, 'warmup': {warm},
             # b's chunk step 1 (stamp b + 0.1 s) and a's step 1 (= b's stamp) come after
             # the first twist of each frame; a twist of the warm-up frame is not a frame's
             'answers': [(warm, 0.95, False), (a, 1.020, False), (b, 1.150, False),
                         ((10, 200_000_000), 1.2, False)]}
    recorder = Recorder({a: record(1.003, 1.004, 1.017, 1.001),
                         b: record(1.104, 1.110, 1.146, 1.102, forwards=8)})
    rows = stream_tail.frame_table(trace, recorder, NoPauses(), chunk_steps=8, period_s=0.1)
    assert [r['stamp'] for r in rows] == [a, b]
    first, second = rows
    assert first['latency_ms'] == pytest.approx(20.0)
    assert first['engine_ms'] == pytest.approx(14.0)
    assert first['wait_ms'] == pytest.approx(1.0)
    assert first['before_ms'] + first['engine_ms'] + first['after_ms'] == \
        pytest.approx(first['latency_ms'])
    assert first['dds_in_ms'] + first['slot_ms'] + first['convert_ms'] + \
        first['to_submit_ms'] == pytest.approx(first['before_ms'])
    assert second['latency_ms'] == pytest.approx(50.0)
    assert second['forwards'] == 8 and not second['overlap'] and not first['overlap']
    assert not math.isnan(second['gc_ms'])
