"""bench/gpu.py (the GPU benchmark) end to end on the tiny preset on CPU, and its fidelity
histogram: the script that produces the recorded H100 tables must keep working where CI runs."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / 'bench'
sys.path.insert(0, str(BENCH))

from gpu_fidelity import bin_distance_histogram, format_histogram_rows  # noqa: E402

FIRST, LAST = 100, 355          # an action-token range for the histogram tests


def run_tiny_gpu_bench(tmp_path, *args) -> dict:
    """bench/gpu.py on the tiny preset on the CPU with ``args``, writing to ``tmp_path``;
    returns its JSON record (the run must succeed)."""
    cmd = [sys.executable, str(BENCH / 'gpu.py'), '--preset', 'tiny', '--device', 'cpu',
           *args, '--out', str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(next(tmp_path.glob('gpu-tiny-cpu-*.json')).read_text())


def test_histogram_counts_bin_distances_per_token():
    ours = [(100, 101, 150), (200, 200, 7)]
    reference = [(100, 103, 152), (201, 200, 7)]
    h = bin_distance_histogram(ours, reference, FIRST, LAST)
    # distances: 0, 2, 2 | 1, 0, 0 (7 == 7 outside the action range counts as equal)
    assert (h['0'], h['1'], h['2'], h['3+']) == (3, 1, 2, 0)
    assert h['tokens'] == 6 and h['frames'] == 2 and h['frames_exact'] == 0


def test_histogram_puts_non_action_disagreement_in_the_last_bucket():
    h = bin_distance_histogram([(7, 100)], [(8, 400)], FIRST, LAST)
    assert h['3+'] == 2 and h['0'] == 0
    table = format_histogram_rows({'ar': h, 'spec': 'failed for a reason'})
    assert '| ar | 1 | 0 | 0.00 % | 0.00 % | 0.00 % | 100.00 % |' in table
    assert 'failed: failed for a reason' in table


def test_histogram_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match='frames'):
        bin_distance_histogram([(1,)], [], FIRST, LAST)
    with pytest.raises(ValueError, match='token counts'):
        bin_distance_histogram([(1, 2)], [(1,)], FIRST, LAST)


def test_gpu_bench_runs_on_cpu_and_every_path_matches_the_reference(tmp_path):
    """Table (both HF baselines, ar, the oracle spec rows, the random EAGLE head rows that
    time drafting and the temporal drafting rows) and the fidelity part."""
    record = run_tiny_gpu_bench(
        tmp_path, '--dtype', 'float32', '--frames', '2', '--warmup', '1', '--streams', '1',
        '--rows', 'ar,oracle,eagle,temporal', '--parts', 'table,fidelity', '--fidelity-frames',
        '3', '--fidelity-kernels', 'off', '--compile-backend', 'eager', '--progress-file',
        str(tmp_path / 'rows.json'))
    assert record['checks']['eager'] == {'ar': 1.0, 'pipeline': 1.0, 'spec': 1.0,
                                         'pipeline_spec': 1.0, 'hf': 1.0}
    modes = [r['mode'] for r in record['rows']]
    assert modes[0] == 'hf' and modes[-1] == 'hf_compiled'       # compiled timed last
    assert {'ar', 'spec@2.0', 'pipeline_spec@3.5', 'spec+eagle(random head)',
            'pipeline_spec+eagle(random head)'} <= set(modes)
    eagle = next(r for r in record['rows'] if r['mode'] == 'spec+eagle(random head)')
    assert eagle['draft_ms'] > 0        # the draft head's forwards are timed
    temporal = next(r for r in record['rows'] if r['mode'] == 'spec+previous action (frames x4)')
    assert temporal['forwards_per_action'] < 7 and temporal['draft_host_ms'] >= 0
    assert 'pipeline_spec+previous action (frames x4)' in modes
    assert all(r['actions_per_s'] > 0 and r['ratio_vs_hf_compiled'] > 0 for r in record['rows'])
    assert record['failures'] == []
    for label, h in record['fidelity'].items():      # float32 on CPU: every token equal to HF
        assert h['0'] == h['tokens'] == 21, label
    progress = json.loads((tmp_path / 'rows.json').read_text())
    assert [r['actions_per_s'] for r in progress['rows']] == \
        [r['actions_per_s'] for r in record['rows']]          # each row as it was timed
    assert [r['mode'] for r in progress['rows']] == [r['mode'] for r in record['rows']]
    assert progress['paced'] == {}


def test_gpu_bench_times_the_pipelined_rows_at_each_prefill_setting(tmp_path):
    """``--max-prefills-per-step 1,2`` with two streams: the pipelined rows once per setting
    (named by it), the others once; every row finishes its frames."""
    record = run_tiny_gpu_bench(
        tmp_path, '--dtype', 'float32', '--frames', '4', '--warmup', '1', '--streams', '2',
        '--rows', 'ar,pipeline,oracle', '--baselines', 'eager', '--parts', 'table',
        '--max-prefills-per-step', '1,2')
    modes = [r['mode'] for r in record['rows']]
    assert {'ar', 'pipeline', 'pipeline x2 prefills', 'spec@3.0', 'pipeline_spec@3.0',
            'pipeline_spec@3.0 x2 prefills'} <= set(modes)
    assert not any(m.startswith('spec@') and 'prefills' in m for m in modes)
    assert 'ar x2 prefills' not in modes
    assert record['failures'] == []
    assert all(r['num_actions'] == 4 and r['streams'] == 2 for r in record['rows'])


def test_attention_ab_part_times_both_backends_with_the_reference_tokens(monkeypatch):
    """``--parts attention`` (run here in-process on the tiny preset, float64): both sides
    built, each row timed and its tokens equal to the eager AR reference; the ring side
    really launches the segment attention kernel (under the CPU interpreter). The fused RoPE
    and norm kernels are left off on both sides here: interpreted, they would take minutes."""
    import argparse
    import gpu_parts
    from gpu_setup import build_model
    from vla_spec_ros import kernels
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    settings = {label: {**extra, 'use_kernels': 'off'}
                for label, extra in gpu_parts.AB_SETTINGS['attention'].items()}
    monkeypatch.setitem(gpu_parts.AB_SETTINGS, 'attention', settings)
    launches = []
    kernel = kernels.segment_attention_triton
    monkeypatch.setattr(kernels, 'segment_attention_triton',
                        lambda *a, **k: launches.append(1) or kernel(*a, **k))
    monkeypatch.setattr(gpu_parts, 'time_pieces', lambda *a, **k: {'stub': 0.0})
    weights = build_model('tiny', 'cpu', 'float64', 0)
    args = argparse.Namespace(frames=2, warmup=1, seed=0, graphs='off', device='cpu',
                              dtype='float64')
    out = gpu_parts.run_ab(args, weights, sorted(weights.norm_stats)[0], 'attention')
    assert list(out) == ['segments', 'ring']
    assert out['ring']['options']['attention_backend'] == 'ring'
    for label, side in out.items():
        assert set(side['rows']) == {'ar', 'pipeline', 'pipeline_spec@3.5'}
        for mode, row in side['rows'].items():
            assert row['reference_agreement'] == 1.0, (label, mode)
            assert row['num_actions'] == 2 and row['step_ms'] > 0
    assert launches       # the ring side ran the kernel


def test_kernels_sweep_smoke_run_validates_every_configuration():
    """``bench/kernels_sweep.py --interpret-smoke``: every swept configuration of both kernels
    agrees with its reference (and gather + SDPA with the segment attention reference)."""
    pytest.importorskip('triton', reason='triton is not installed')
    done = subprocess.run([sys.executable, str(BENCH / 'kernels_sweep.py'), '--interpret-smoke'],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'MISMATCH' not in done.stdout and 'failed' not in done.stdout
    lines = done.stdout.splitlines()
    assert sum(line.strip().startswith('block_h=') for line in lines) == 2
    assert sum(line.strip().startswith('block_m=') for line in lines) == 1
    assert any(line.startswith('segment_attention') and line.endswith(' ok') for line in lines)


@pytest.mark.skipif(importlib.util.find_spec('triton') is None,
                    reason='needs triton (the CPU interpreter)')
def test_fp8_products_times_the_quantising_producers_and_checks_their_codes(interpret):
    """The second table of ``bench/fp8_products.py``: each producer alone, the three launches
    of the route without fusion (scale, produce, quantise), and fused; the fused codes
    checked equal to the three launches' (a quantisation that differs is a MISMATCH)."""
    import types
    import torch
    from fp8_products import time_producer
    from kernels_sweep import load_kernels
    kernels = load_kernels()
    for name, width in (('rms_norm', 64), ('silu_mul', 96)):
        row = time_producer(kernels, name, width, 2, torch.device('cpu'), torch.float32)
        assert row['ok'] and {'alone', 'before', 'fused'} <= set(row), row
    wrong = types.SimpleNamespace(**{name: getattr(kernels, name) for name in dir(kernels)
                                     if not name.startswith('__')}, __name__=kernels.__name__)
    wrong.quantize_rows_triton = lambda x: tuple(
        part * 2 if part.dtype == torch.float32 else part
        for part in kernels.quantize_rows_triton(x))
    assert not time_producer(wrong, 'silu_mul', 96, 2, torch.device('cpu'), torch.float32)['ok']


def test_fp8_products_smoke_run_checks_every_product_against_the_definition():
    """``bench/fp8_products.py --smoke`` (the fp8 part's per-product timing, on CPU with the
    dequantised reference in place of _scaled_mm): a row per shape and row count, each
    checked against the product computed from its definition; the columns only a GPU fills
    stay empty. A wrong product is caught (MISMATCH)."""
    import types
    import torch
    from fp8_products import time_shape
    from kernels_sweep import load_kernels
    kernels = load_kernels()
    good = time_shape(kernels, 'qkv', 48, 64, 3, torch.device('cpu'), torch.float32)
    assert good['ok']
    wrong = types.SimpleNamespace(**{name: getattr(kernels, name) for name in dir(kernels)
                                     if not name.startswith('__')})
    wrong.fp8_linear_ref = lambda x, wq, scale: kernels.fp8_linear_ref(x, wq, scale) * 1.05
    assert not time_shape(wrong, 'qkv', 48, 64, 3, torch.device('cpu'), torch.float32)['ok']
    done = subprocess.run([sys.executable, str(BENCH / 'fp8_products.py'), '--smoke'],
                          capture_output=True, text=True, timeout=300, cwd=BENCH)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith('| qkv')
            or line.startswith('| down')]
    assert len(rows) == 4 and all(line.endswith('| ok |') for line in rows)
    assert all(' – | – | – | – |' in line for line in rows)     # quant, scaled_mm, ... (GPU)


def test_gpu_bench_fp8_part_and_prefill_rows_run_on_cpu(tmp_path):
    """``--parts fp8`` (FP8 weights through the dequantised reference on a CPU: both sides'
    rows with their own AR tokens, the step-time ratio and the bin distance of fp8 from auto)
    and ``--rows prefill`` (speculative_prefill on and off, repeated and episode-like frames),
    as bench/gpu_suite.sh fp8 and table-prefill run them on a GPU."""
    record = run_tiny_gpu_bench(
        tmp_path, '--dtype', 'float32', '--frames', '2', '--warmup', '1', '--streams', '1',
        '--rows', 'prefill', '--parts', 'table,fp8', '--baselines', 'eager', '--fidelity-frames',
        '3', '--fidelity-action-only')
    assert record['failures'] == []
    modes = {r['mode'] for r in record['rows']}
    for mode in ('spec', 'pipeline_spec'):
        for state in ('on', 'off'):
            for frames in ('frames x4', 'episode-like x8'):
                assert f'{mode}+previous action, prefill {state} ({frames})' in modes
    fp8 = record['fp8']
    # fp8 by the default route, and with each product quantising its own input (the same
    # function: AR's tokens too).
    assert set(fp8['sides']) == {'auto', 'fp8', 'fp8-unfused'}
    assert set(fp8['step_ms_ratio_by_side']) == {'fp8-unfused'}
    for side in fp8['sides'].values():
        for mode, row in side['rows'].items():
            assert row['reference_agreement'] == 1.0 and row['num_actions'] == 2, mode
    assert set(fp8['step_ms_ratio']) == {'ar', 'pipeline', 'pipeline_spec@3.5'}
    assert all(r > 0 for r in fp8['step_ms_ratio'].values())
    assert fp8['bin_distance']['tokens'] == 21 and fp8['action_tokens_only']
    markdown = next(tmp_path.glob('gpu-tiny-cpu-*.md')).read_text()
    assert 'weight_dtype fp8 against auto' in markdown and 'fp8 AR vs auto AR' in markdown


def test_paced_capture_schedule_offsets_the_robots_within_a_period():
    from vla_spec_ros.harness.speed import capture_schedule
    schedule = capture_schedule(num_streams=4, frames_per_stream=2, rate_hz=25.0)
    assert [(robot, k) for _, robot, k in schedule] == [
        (0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
    assert [round(at * 1e3, 6) for at, _, _ in schedule] == [0, 10, 20, 30, 40, 50, 60, 70]


def test_gpu_bench_paced_part_serves_every_robot(tmp_path):
    """``--parts paced`` (bench/gpu_suite.sh table-paced) on the tiny preset: every row of
    1 and 2 robots, AR and the default configuration at each prefill setting up to the robot
    count, and the frames-that-repeat rows; the tiny model keeps up with 2 cameras at 25 Hz
    on a CPU, so every robot of every row is answered."""
    record = run_tiny_gpu_bench(
        tmp_path, '--dtype', 'float32', '--graphs', 'off', '--parts', 'paced', '--baselines', '',
        '--paced-robots', '1,2', '--paced-prefills', '1,2', '--paced-seconds', '0.4',
        '--paced-warmup-frames', '2', '--progress-file', str(tmp_path / 'rows-paced.json'))
    paced = record['paced']
    # The progress file holds the whole part once it is done (a run cut short keeps its rows).
    progress = json.loads((tmp_path / 'rows-paced.json').read_text())
    assert [r['label'] for r in progress['paced']['rows']] == [r['label'] for r in paced['rows']]
    assert progress['paced']['floor_ms'] == paced['floor_ms']
    assert paced['floor_ms'] > 0
    rows = [(r['label'], r['robots_n'], r['prefills']) for r in paced['rows']]
    assert rows == [('ar', 1, 1), ('default (pipeline_spec)', 1, 1),
                    ('spec, frames that repeat', 1, 1),
                    ('pipeline_spec, frames that repeat', 1, 1),
                    ('ar', 2, 1), ('default (pipeline_spec)', 2, 1),
                    ('default (pipeline_spec)', 2, 2), ('default, frames that repeat', 2, 2)]
    for row in paced['rows']:
        assert 'error' not in row, row
        assert len(row['robots']) == row['robots_n']
        for robot in row['robots']:
            assert robot['num_frames'] == 10 and robot['num_answered'] > 0, row['label']
            assert 0 < robot['latency_p50_ms'] <= robot['latency_p99_ms'] \
                <= robot['latency_max_ms']
    assert 'robots paced at 25 Hz' in next(tmp_path.glob('gpu-tiny-cpu-*.md')).read_text()


def test_paced_verdicts_ignore_the_order_of_a_starved_robot():
    """A robot with no answer is counted (0 % answered, robots_unanswered) and does not turn
    the worst-latency verdicts into NaN or hide, whatever the robots' order."""
    from gpu_paced import summarize
    from vla_spec_ros.harness.speed import _paced_summary
    served = _paced_summary([0.020] * 9 + [0.030], 10, 25.0, 1.0)
    starved = _paced_summary([], 10, 25.0, 1.0)
    for stats in ([served, starved], [starved, served]):
        row = summarize(stats)
        assert row['least_answered'] == 0.0 and row['robots_unanswered'] == 1
        assert row['worst_p50_ms'] == 20.0 and row['oldest_ms'] == 30.0


def test_gpu_verdicts_read_the_recorded_h200_run():
    """bench/gpu_verdicts.py on the committed H200 results: the values are the recorded ones
    (bench/results/h200/20261126-suite, bench/README.md) and each verdict follows its target."""
    from gpu_verdicts import verdicts
    folder = BENCH / 'results' / 'h200' / '20261126-suite'
    rows = {name: (measured, ok) for name, measured, ok in verdicts(folder)}
    measured, ok = rows['one robot, frames that repeat']
    assert '11.4 ms = 1.20x the floor 9.54 ms' in measured and ok is True
    measured, ok = rows['4 robots at the paced camera rate']
    assert 'least answered 72.0%' in measured and ok is False
    measured, ok = rows['AR per action']       # the H200's target: 35 ms
    assert measured.startswith('40.2 ms') and 'on NVIDIA H200' in measured and ok is False
    measured, ok = rows['FP8 fidelity and speed']  # faithful, but slower than bf16 then
    assert '99.86% of 1400' in measured and 'ar 1.35' in measured and ok is False
    assert 'prefill 1.68, decode_1 1.34' in measured
    measured, ok = rows['tests: table-paced-fp8-tests/log-tests.txt']
    assert measured == '39 failed, 218 passed, 3 skipped' and ok is False
    # The second run, after the segment-attention and FP8 fixes: its paced part was cut short
    # (the AR row comes from its progress file) and the four robots were re-run alone.
    folder = BENCH / 'results' / 'h200' / '20261126b-suite'
    rows = {name: (measured, ok) for name, measured, ok in verdicts(folder)}
    measured, ok = rows['tests: tests-fp8-paced/log-tests.txt']
    assert measured == '261 passed, 5 skipped' and ok is True
    measured, ok = rows['AR per action']       # the device read off the finished records
    assert measured.startswith('40.6 ms') and 'cut short' in measured and ok is False
    assert 'on NVIDIA H200' in measured
    measured, ok = rows['FP8 fidelity and speed']
    assert 'ar 1.03, pipeline 0.98' in measured and ok is False
    measured, ok = rows['4 robots at the paced camera rate']
    assert 'least answered 85.0%, worst p99 171.5 ms' in measured and ok is False


def test_gpu_verdicts_read_the_2026_11_30_h200_run():
    """The 2026-11-30 record: AR and the decode floor against issue 50's targets, pi0-FAST
    against the compiled baseline, and the reasoning step withheld (its verifier left the
    oracle's trajectory: 3.5 tokens per forward where 12.2 were meant)."""
    from gpu_verdicts import verdicts
    folder = BENCH / 'results' / 'h200' / '20261130-suite'
    rows = {name: (measured, ok) for name, measured, ok in verdicts(folder)}
    measured, ok = rows['AR per action']
    assert measured.startswith('41.6 ms') and ok is False
    measured, ok = rows['bf16 decode over its weight streaming']
    assert measured.startswith('decode 4.87 ms = 1.54x') and ok is False
    measured, ok = rows['pi0-FAST against the compiled baseline']
    assert '104.7 ms per chunk against HF compiled 214.1 (0.489 x' in measured and ok is False
    measured, ok = rows['reasoning step (ECoT shape)']
    assert '0.335 x AR' in measured and "not the engine's speed" in measured and ok is None
    assert rows['tests: run1/log-gpu-tests.txt'] == ('5 failed, 337 passed, 8 skipped', False)


def test_gpu_verdicts_hold_the_ar_target_of_the_device_and_fp8_to_its_pieces():
    """AR: 35 ms on an H200, 45 elsewhere (a GH200 is not an H200), each row against its own
    device's target; FP8: faithful is not enough, the prefill and decode pieces must each take
    at most 0.65x the model dtype's time (not measured without them); a floor part from a CPU
    run is not a floor."""
    from gpu_verdicts import ar_action, decode_floor, fp8

    def ar_record(device, ms):
        return {'environment': {'cuda': device},
                'rows': [{'mode': 'ar', 'graphs': True, 'streams': 1, 'ms_per_action': ms}]}
    assert ar_action([ar_record('NVIDIA H200', 40.0)])[1] is False
    assert ar_action([ar_record('NVIDIA H100 80GB HBM3', 40.0)])[1] is True
    assert ar_action([ar_record('NVIDIA H200', 34.0)])[1] is True
    assert ar_action([ar_record('NVIDIA GH200 480GB', 40.0)])[1] is True
    # Met on one device is met (the issue's targets are per device): the H100's 44 ms.
    text, ok = ar_action([ar_record('NVIDIA H100 80GB HBM3', 44.0),
                          ar_record('NVIDIA H200', 40.0)])
    assert ok is True and text.startswith('44.0 ms') and 'H100' in text
    assert 'a device not recorded' in ar_action([ar_record(None, 40.0)])[0]
    assert decode_floor([{'decode_floor': {'bytes': 10, 'decode_ms_graphs_off': 3.0}}])[1] \
        is None

    def fp8_record(prefill, decode, off_by_two=0):
        pieces = {'prefill': 10.0, 'decode_1': 5.0}
        return {'fp8': {'sides': {'auto': {'pieces_ms': pieces},
                                  'fp8': {'pieces_ms': {'prefill': 10.0 * prefill,
                                                        'decode_1': 5.0 * decode}}},
                        'step_ms_ratio': {'ar': decode},
                        'bin_distance': {'0': 100 - off_by_two, '1': 0, '2': off_by_two,
                                         '3+': 0, 'tokens': 100}}}
    assert fp8([fp8_record(0.6, 0.6)])[1] is True
    text, ok = fp8([fp8_record(0.6, 0.7)])
    assert ok is False and 'prefill 0.60, decode_1 0.70' in text
    assert fp8([fp8_record(0.6, 0.6, off_by_two=2)])[1] is False
    no_pieces = fp8_record(0.6, 0.6)
    del no_pieces['fp8']['sides']
    assert fp8([no_pieces])[1] is None


def test_gpu_verdicts_read_a_run_cut_short_from_its_progress_file(tmp_path):
    """A paced part cut by its time limit leaves no gpu-*.json; its progress file (both
    formats: the table's former list of rows, the record-shaped dict) still gives verdicts,
    marked as from a run cut short, and a finished record wins over a progress file."""
    from gpu_progress import ProgressFile
    from gpu_verdicts import verdicts
    from vla_spec_ros.bench import BenchRow
    nan = float('nan')
    ar = BenchRow(mode='ar', num_actions=40, actions_per_s=25.0, latency_p50_ms=70.0,
                  latency_p99_ms=72.0, forwards_per_action=7.0, acceptance_length=1.0,
                  ratio_vs_hf=nan, latency_ratio_vs_hf=nan)
    progress = ProgressFile(str(tmp_path / 'rows-table-paced.json'))
    progress.add_row('ar graphs=True streams=1', ar, True, 1)
    assert not list(tmp_path.glob('*.partial'))      # written whole, then renamed
    robot = {'answered_fraction': 1.0, 'latency_p50_ms': 11.0, 'latency_p99_ms': 20.0}
    progress.set_paced({'floor_ms': 10.0, 'rows': [
        {'label': 'spec, frames that repeat', 'mode': 'spec', 'robots_n': 1, 'prefills': 1,
         'frames': 'repeat', 'robots': [robot], 'least_answered': 1.0, 'worst_p50_ms': 11.0,
         'worst_p99_ms': 20.0, 'p50_over_floor': 1.1}]})
    rows = {name: (measured, ok) for name, measured, ok in verdicts(tmp_path)}
    measured, ok = rows['one robot, frames that repeat']
    assert 'p50 11.0 ms = 1.10x the floor 10.00 ms' in measured and ok is True
    assert measured.endswith('[from a run cut short]')
    measured, ok = rows['AR per action']
    assert measured.startswith('40.0 ms') and 'cut short' in measured and ok is True
    assert rows['4 robots at the paced camera rate'][1] is None
    # The former format: a list of table rows, graphs only in the label.
    old = tmp_path / 'old'
    old.mkdir()
    (old / 'rows-table.json').write_text(json.dumps(
        [{'label': 'ar graphs=False streams=1', 'mode': 'ar', 'actions_per_s': 10.0},
         {'label': 'ar graphs=True streams=1', 'mode': 'ar', 'actions_per_s': 20.0}]))
    measured, ok = dict((n, (m, o)) for n, m, o in verdicts(old))['AR per action']
    assert measured.startswith('50.0 ms per action (best of 1 rows') and ok is False
    # A progress file cut mid-write is listed as skipped; the other verdicts stand.
    (old / 'rows-cut.json').write_text('{"rows": [{"label": "ar gra')
    rows = {n: (m, o) for n, m, o in verdicts(old)}
    assert rows['progress file'] == ('rows-cut.json (JSONDecodeError): unreadable, skipped', None)
    assert rows['AR per action'][0].startswith('50.0 ms')
    (old / 'rows-cut.json').unlink()
    # A finished record of the same target is read instead of the progress file.
    (old / 'gpu-x.json').write_text(json.dumps(
        {'rows': [{'mode': 'ar', 'graphs': True, 'ms_per_action': 44.0}]}))
    measured, ok = dict((n, (m, o)) for n, m, o in verdicts(old))['AR per action']
    assert measured.startswith('44.0 ms') and 'cut short' not in measured and ok is True


def test_gpu_verdicts_say_not_measured_for_an_empty_folder(tmp_path):
    from gpu_verdicts import verdicts
    assert all(ok is None for _, _, ok in verdicts(tmp_path))


def test_decode_floor_counts_each_weight_once_and_names_kernel_categories(tmp_path):
    """The floor part's byte count (every language-model weight once; the embedding table as
    one row, unless the head is tied to it and reads it all) and kernel categories; the part
    runs on the CPU (wall time and the CPU operator table)."""
    from gpu_decode_floor import category, decode_bytes
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.models.openvla.vla import OpenVLA
    from vla_spec_ros.models.pi0fast.family import build_model
    for model, tied in ((OpenVLA(preset('tiny')), False),
                        (build_model(preset('pi0fast-tiny')), True)):
        lm = model.language_model
        embed = lm.model.embed_tokens.weight
        assert (lm.lm_head.weight.data_ptr() == embed.data_ptr()) == tied
        unique = {t.data_ptr(): t.numel() * t.element_size()
                  for t in list(lm.parameters()) + list(lm.buffers())}
        expected = sum(unique.values()) if tied else (
            sum(unique.values()) - embed.numel() * embed.element_size()
            + embed.shape[1] * embed.element_size())
        assert decode_bytes(model) == expected
    assert category('nvjet_sm90_tst_256x8_64x6_4x1_v_bz_TNT') == 'matmul'
    assert category('_rms_norm_body') == 'norm'
    assert category('cudnn_generated_fort_native_sdpa_sm80_flash_fprop') == 'attention'
    assert category('_rope_kv_write_body') == 'rope+kv'
    assert category('void at::native::vectorized_gather_kernel<16, long>') == 'copy/index'
    assert category('some_unknown_kernel') == 'other'
    record = run_tiny_gpu_bench(tmp_path, '--dtype', 'float32', '--graphs', 'off', '--parts',
                                'floor', '--baselines', '', '--frames', '2', '--warmup', '1',
                                '--floor-forwards', '2')
    floor = record['decode_floor']
    assert floor['bytes'] > 0 and floor['decode_ms_graphs_off'] > 0
    assert 'Self CPU time total' in floor['cpu_table']


def test_pi0fast_gpu_bench_smoke_run_times_every_path(tmp_path):
    """bench/gpu_pi0fast.py on pi0fast-tiny on the CPU (random weights built in memory):
    HF eager, HF compiled (static cache), ar, spec and pipeline_spec rows, then the oracle rows
    on decisive weights (AR again, the spec modes drafting its tokens: every frame equal to it,
    fewer forwards than AR), every chunk the same number of tokens; the pi0-FAST verdict reads
    the record, the oracle's projection beside the measured default."""
    done = subprocess.run([sys.executable, str(BENCH / 'gpu_pi0fast.py'), '--smoke', '--out',
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(next(tmp_path.glob('pi0fast-pi0fast-tiny-cpu-*.json')).read_text())
    labels = [r['label'].split(' (')[0] for r in record['rows']]
    assert labels == ['hf eager', 'hf compiled', 'ar', 'spec', 'pipeline_spec', 'ar decisive',
                      'spec oracle', 'pipeline_spec oracle']
    assert all(r['tokens_per_action'] == record['tokens'] for r in record['rows'])
    assert all(r['ms_per_chunk'] > 0 for r in record['rows'])
    rows = {label: r for label, r in zip(labels, record['rows'])}
    for label in ('spec oracle', 'pipeline_spec oracle'):
        assert rows[label]['frames_equal_reference'] == 1.0
        assert rows[label]['forwards_per_action'] < rows['ar decisive']['forwards_per_action'] / 2
    from gpu_verdicts import pi0fast_chunk
    text, ok = pi0fast_chunk([record])
    assert ok is not None and 'compiled' in text and 'oracle' in text


def test_reasoning_gpu_bench_decisive_weights_keep_bf16_paths_on_one_trajectory(tmp_path):
    """In bf16 a plain random model's near-flat logits tie, and a tie flips between the eager
    reference and the engine's kernels: the rows leave the trajectory the oracle drafts (the
    2026-11-30 H200 run). The bench's decisive weights (gpu_setup.make_decisive_) keep every
    path on the eager reference's tokens for the whole 200-token budget (the walk avoids the
    codec's marker, stop and action tokens), so the oracle's acceptance is the one it was set
    for. (Whether the plain model ties on a given CPU depends on the CPU and the torch build;
    on this project's CI machine `--flat-logits` fails the exact check.)"""
    done = subprocess.run([sys.executable, str(BENCH / 'gpu_reasoning.py'), '--preset',
                           'ecot-tiny', '--device', 'cpu', '--dtype', 'bfloat16',
                           '--reasoning-tokens', '200', '--frames', '2', '--warmup', '1',
                           '--no-hf', '--out', str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(next(tmp_path.glob('reasoning-ecot-tiny-*.json')).read_text())
    rows = {r['label'].split(' ')[0]: r for r in record['rows']}
    assert record['tokens_per_step'] > 200 and record['failures'] == []
    for mode in ('ar', 'spec', 'pipeline_spec'):
        assert rows[mode]['frames_equal_reference'] == 1.0
    for mode in ('spec', 'pipeline_spec'):
        assert rows[mode]['drafted_prefix'] == 1.0 and rows[mode]['oracle_source'] == 'ar row'
    gained = record['tokens_per_step'] / rows['pipeline_spec']['forwards_per_action']
    assert gained > 0.8 * record['args']['tokens_per_forward']


def test_reasoning_gpu_bench_smoke_run_times_every_path(tmp_path):
    """bench/gpu_reasoning.py on ecot-tiny on the CPU (random weights built in memory, the text
    budget run out on every path): HF generate, ar, spec and pipeline_spec rows; the engine's
    rows checked token-equal to the eager AR reference inside the script (a row that is not
    would be a failure and a non-zero exit); the oracle chain needs fewer forwards than AR."""
    done = subprocess.run([sys.executable, str(BENCH / 'gpu_reasoning.py'), '--smoke', '--out',
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(next(tmp_path.glob('reasoning-ecot-tiny-*.json')).read_text())
    assert record['failures'] == []
    rows = {r['label'].split(' ')[0]: r for r in record['rows']}
    assert list(rows) == ['hf', 'ar', 'spec', 'pipeline_spec']
    assert rows['ar']['forwards_per_action'] == record['tokens_per_step'] > 40
    for mode in ('spec', 'pipeline_spec'):
        assert rows[mode]['forwards_per_action'] < rows['ar']['forwards_per_action'] / 4
    for mode in ('ar', 'spec', 'pipeline_spec'):     # the agreement the table reports
        assert rows[mode]['frames_equal_reference'] == rows[mode]['shared_prefix'] == 1.0
    assert all(r['ms_per_step'] > 0 for r in record['rows'])
    from gpu_verdicts import reasoning_step
    text, ok = reasoning_step([record])
    assert ok is not None and 'x AR' in text
