"""One-command speed benchmark: eager checks, then HF AR vs our modes, in the same run.

    python bench/gpu.py --preset openvla-7b --device cuda --dtype bfloat16   # the GPU target
    python bench/gpu.py --preset tiny --device cpu --dtype float32           # runs anywhere

Builds the preset with random weights directly on the device (no checkpoint), checks every fast
path against the eager AR reference on that device (token agreement; HF logits tolerance), then
times two HF transformers baselines (eager ``generate``; static cache + ``torch.compile``, see
vla_spec_ros/baseline.py), our AR, pipeline, spec and pipeline_spec. Random weights cannot
train a draft head, so speculation uses an oracle draft that proposes the AR tokens with a
per-position error rate chosen to hit the acceptance lengths 2.0 / 3.0 / 3.5 (measured and
printed; 3.5 is the most seven tokens allow: the prefill decides one, one verify round the
other six). Each configuration runs with 1 and 4 camera streams. Prints a table and writes
JSON + Markdown to ``--out``.

``--parts`` adds, in the same process and on the same weights:
- ``fidelity``: for ``--fidelity-frames`` frames, the bin distance of every action token of
  each mode (CUDA graphs as in the first ``--graphs`` setting, fused kernels off and on)
  against HF eager (bench/gpu_fidelity.py);
- ``profile``: torch.profiler over one mode (``--profile-mode``), the kernel table by device
  time;
- ``threads``: the pipeline row at several host intra-op thread counts;
- ``kernels``: ``use_kernels`` off, then on: the model pieces and the ar / pipeline /
  pipeline_spec rows (bench/gpu_parts.py);
- ``attention``: the same with ``attention_backend`` segments, then ring (fused kernels on
  for both);
- ``paced``: 1, 2 and 4 robots, each camera at ``--camera-hz`` (paced, not saturating), AR
  and the default configuration at each ``max_prefills_per_step``: per-robot frames answered
  and capture -> action p50 / p99, against one robot's floor (vision + one prefill) measured in
  the same run (bench/gpu_paced.py);
- ``floor``: one decode forward against the weight bytes over the copy bandwidth measured
  in the same run, and its device time by kernel category (bench/gpu_decode_floor.py);
- ``fp8``: ``weight_dtype`` auto, then fp8 (the weights loaded again and quantised): the model
  pieces and the ar / pipeline / pipeline_spec rows of each, the step-time ratio, and the bin
  distance of fp8's AR tokens from auto's on ``--fidelity-frames`` frames.

``--rows prefill`` (with the table part) times spec / pipeline_spec drafting the previous action
with ``speculative_prefill`` on and off, on frames each shown 4 times in a row and on
episode-like frames (runs of 8 steps of one drifting scene).

The roofline columns use the H100 floor (bench/README.md) scaled to the preset: weight bytes
streamed per forward and FLOPs per action from the parameter count.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from gpu_decode_floor import run_decode_floor
from gpu_parts import format_fp8, run_ab, run_fidelity, run_fp8, run_profile, run_thread_sweep
from gpu_paced import format_paced, run_paced_part
from gpu_progress import ProgressFile
from gpu_setup import (EPISODE_RUN, TARGET_ACCEPTANCE, TEMPORAL_REPEATS, build_model,
                       build_runner, eager_reference, engine_for, engine_options,
                       episode_like_frames, load_checkpoint, repeated_frames, run_all,
                       time_pieces)
from vla_spec_ros.baseline import generate_tokens
from vla_spec_ros.bench import BenchRow, bench_engine, bench_hf, environment, make_frames
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.testing import OracleDrafter


def check_fast_paths(runner, norm_stats, frames, base: dict, hf) -> dict:
    """Share of frames whose tokens equal the plain AR reference, per mode (and HF)."""
    ref_list = eager_reference(runner, frames, base)
    report = {}
    for mode in ('ar', 'pipeline', 'spec', 'pipeline_spec'):
        draft = OracleDrafter(lambda rid: ref_list[rid], runner.max_action_tokens, 0.3, seed=1) \
            if mode in ('spec', 'pipeline_spec') else None
        engine = Engine(runner, norm_stats, EngineConfig(mode=mode, tree_depth=5,
                                                         tree_top_k=1, tree_max_nodes=6,
                                                         **base), draft=draft)
        finished = run_all(engine, frames)
        errors = sorted({fin.error for fin in finished if fin.error is not None})
        if errors:
            report[mode] = f'errors: {errors}'
            continue
        got = [fin.result.tokens for fin in finished]
        report[mode] = float(np.mean([a == b for a, b in zip(got, ref_list)]))
    hf_tokens = [tuple(generate_tokens(hf, f.image, f.instruction)) for f in frames]
    report['hf'] = float(np.mean([a == b for a, b in zip(hf_tokens, ref_list)]))
    return report


# Reference/anchors of an H100 (bf16, OpenVLA-7B): the floor this table is compared with.
FLOOR_MS = {'decode': 4.45, 'prefill': 5.1, 'ar_action': 32.0}
FLOOR_ACTIONS_PER_S = 192.0   # if every forward were compute-bound


def roofline(runner, row: BenchRow) -> dict:
    """Achieved bandwidth and rate, and the distance to the floor: ``x_ar_floor`` is ms per
    action over the AR floor (32 ms: prefill + six weight-streaming decodes), ``x_latency_floor``
    the p50 latency over it, ``of_compute_bound`` actions/s over the compute-bound rate
    (every weight used once per token of one action, at the matrix units' peak)."""
    params = sum(p.numel() for p in runner.model.parameters())
    nbytes = params * next(runner.model.parameters()).element_size()
    # FLOPs of one action: every weight is used once per token of prefill + 6 decodes.
    num_tokens = runner.cfg.num_patches + 20 + runner.max_action_tokens - 1
    flops_per_action = 2 * params * num_tokens
    forwards_per_s = row.forwards_per_action * row.actions_per_s \
        if np.isfinite(row.forwards_per_action) else 7 * row.actions_per_s
    ms_per_action = 1e3 / row.actions_per_s
    return {'params': params, 'bandwidth_GBps': forwards_per_s * nbytes / 1e9,
            'tflops': row.actions_per_s * flops_per_action / 1e12,
            'ms_per_action': ms_per_action,
            'x_ar_floor': ms_per_action / FLOOR_MS['ar_action'],
            'x_latency_floor': row.latency_p50_ms / FLOOR_MS['ar_action'],
            'of_compute_bound': row.actions_per_s / FLOOR_ACTIONS_PER_S}


def run_table(args, weights, key, baselines, report, progress) -> list:
    """Every (mode, graphs, streams) row, the baselines measured in the same run."""
    graph_settings = [g.strip() == 'on' for g in args.graphs.split(',')]
    prefill_settings = [int(p) for p in args.max_prefills_per_step.split(',')]
    groups = set(args.rows.split(','))
    rows: list[tuple[str, bool, int, BenchRow]] = []
    failures = report['failures']

    def attempt(label, make_row, graphs=False, streams=1, mode=None):
        try:
            row = make_row()
        except Exception as exc:    # noqa: BLE001 - recorded in the table's failures
            failures.append(f'{label}: {type(exc).__name__}: {exc}')
            print(failures[-1], flush=True)
            return None
        print(label, row, flush=True)
        if mode is not None:
            row.mode = mode                 # the row's name, as in the final record
        progress.add_row(label, row, graphs, streams)
        return row

    def bench_baseline(name, streams, frames):
        if name in baselines:
            row = attempt(f'{name} {streams} streams',
                          lambda: bench_hf(baselines[name], frames, args.warmup),
                          streams=streams, mode=name)
            if row is not None:
                rows.append((name, False, streams, row))

    runner = None
    for use_graphs in graph_settings:
        base = engine_options(args, use_graphs)
        runner = build_runner(weights, base)
        setting = 'graphs' if use_graphs else 'eager'
        size = weights.cfg.image_size
        report['checks'][setting] = check_fast_paths(
            runner, weights.norm_stats, make_frames(4, size, args.seed + 7, key), base,
            baselines['hf'])
        print(f'token agreement with the plain AR reference ({setting}):',
              report['checks'][setting], flush=True)
        report['pieces_ms'][setting] = time_pieces(runner, make_frames(2, size, 3, key), base)
        print(f'ms per piece ({setting}):', report['pieces_ms'][setting], flush=True)
        for streams in [int(s) for s in args.streams.split(',')]:
            frames = make_frames(args.frames + args.warmup, weights.cfg.image_size, args.seed, key,
                                 streams)
            # Request ids of a fresh engine index ``ref`` (warm-up frames are submitted first).
            ref = eager_reference(runner, frames, base)
            if use_graphs == graph_settings[0]:     # HF eager, once per stream count
                bench_baseline('hf', streams, frames)
            labels = [m for m in ('ar', 'pipeline') if m in groups]
            labels += [f'{m}@{t}' for t in TARGET_ACCEPTANCE if 'oracle' in groups
                       for m in ('spec', 'pipeline_spec')]
            for label, prefills in with_prefill_settings(labels, prefill_settings):
                name = row_name(label, prefills)
                options = dict(base, max_prefills_per_step=prefills)
                row = attempt(f'{name} graphs={use_graphs} streams={streams}',
                              lambda lb=label, o=options: bench_engine(
                                  engine_for(runner, weights, lb, o, ref, args.seed),
                                  frames, args.warmup), use_graphs, streams, name)
                if row is not None:
                    rows.append((name, use_graphs, streams, row))
            # Spec rows with a real drafter: (group, row label, drafter options, frames).
            temporal = dict(draft_path='previous_action', tree_depth=5, tree_max_nodes=6)
            drafted = [('eagle', 'eagle(random head)', dict(draft_path='random'), frames),
                       ('temporal', f'previous action (frames x{TEMPORAL_REPEATS})', temporal,
                        repeated_frames(frames, streams, TEMPORAL_REPEATS))]
            for prefill in (True, False):
                state = dict(temporal, speculative_prefill=prefill)
                name = f'previous action, prefill {"on" if prefill else "off"}'
                drafted += [('prefill', f'{name} (frames x{TEMPORAL_REPEATS})', state,
                             repeated_frames(frames, streams, TEMPORAL_REPEATS)),
                            ('prefill', f'{name} (episode-like x{EPISODE_RUN})', state,
                             episode_like_frames(frames, streams, EPISODE_RUN))]
            for group, label, drafting, row_frames in drafted:
                modes = ['spec', 'pipeline_spec'] if group in groups else []
                for mode, prefills in with_prefill_settings(modes, prefill_settings):
                    cfg = EngineConfig(mode=mode, **drafting,
                                       **dict(base, max_prefills_per_step=prefills))
                    engine = Engine(runner, weights.norm_stats, cfg)
                    name = row_name(f'{mode}+{label}', prefills)
                    row = attempt(f'{name} graphs={use_graphs} streams={streams}',
                                  lambda e=engine, f=row_frames: bench_engine(e, f, args.warmup),
                                  use_graphs, streams, name)
                    if row is not None:
                        rows.append((name, use_graphs, streams, row))
            print(f'{setting}, {streams} stream(s) done', flush=True)
    # The compiled baseline runs last: torch.compile leaves process-wide state behind
    # (compile workers, dynamo hooks, its CUDA-graph pool) that slowed every later row's host
    # work by up to a third when it ran first (bench/README.md).
    for streams in [int(s) for s in args.streams.split(',')]:
        bench_baseline('hf_compiled', streams, make_frames(args.frames + args.warmup,
                                                           weights.cfg.image_size, args.seed, key,
                                                           streams))
    records = []
    for m, g, s, r in rows:
        anchors = {name: next((x for mm, _, ss, x in rows if mm == name and ss == s), None)
                   for name in baselines}
        hf = anchors.get('hf')
        if hf is not None:
            r.ratio_vs_hf = r.actions_per_s / hf.actions_per_s
            r.latency_ratio_vs_hf = r.latency_p50_ms / hf.latency_p50_ms
        compiled = anchors.get('hf_compiled')
        records.append({'graphs': g, 'streams': s, **asdict(r), **roofline(runner, r),
                        'ratio_vs_hf_compiled': r.actions_per_s / compiled.actions_per_s
                        if compiled is not None else float('nan')})
    return records


def with_prefill_settings(labels: list[str], settings: list[int]):
    """(label, max_prefills_per_step) per row: every setting for the pipelined modes, 1 for
    the others (they admit one frame at a time whatever the setting)."""
    for label in labels:
        mode = label.partition('@')[0].partition('+')[0]
        for prefills in settings if mode in ('pipeline', 'pipeline_spec') else [1]:
            yield label, prefills


def row_name(label: str, prefills: int) -> str:
    return label if prefills == 1 else f'{label} x{prefills} prefills'


def format_table(records: list) -> str:
    lines = ['| mode | graphs | streams | actions/s | ×HF eager | ×HF compiled | ms/action | '
             '×AR floor | p50 ms | p99 ms | p50 ×HF | p50 ×floor | fwd/action | accept len | '
             'ms/step | host ms/step | vision / verifier / draft ms | GB/s | TFLOP/s | '
             'of compute-bound |', '|' + '---|' * 20]
    for r in records:
        lines.append(
            f'| {r["mode"]} | {"on" if r["graphs"] else "off"} | {r["streams"]} | '
            f'{r["actions_per_s"]:.2f} | {r["ratio_vs_hf"]:.2f} | '
            f'{r["ratio_vs_hf_compiled"]:.2f} | {r["ms_per_action"]:.1f} | '
            f'{r["x_ar_floor"]:.2f} | {r["latency_p50_ms"]:.1f} | {r["latency_p99_ms"]:.1f} | '
            f'{r["latency_ratio_vs_hf"]:.2f} | {r["x_latency_floor"]:.2f} | '
            f'{r["forwards_per_action"]:.2f} | {r["acceptance_length"]:.2f} | '
            f'{r["step_ms"]:.2f} | {r["host_ms"]:.2f} | {r["vision_ms"]:.1f} / '
            f'{r["verifier_ms"]:.1f} / {r["draft_ms"]:.1f} | {r["bandwidth_GBps"]:.0f} | '
            f'{r["tflops"]:.2f} | {100 * r["of_compute_bound"]:.0f} % |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--preset', default='tiny')
    ap.add_argument('--checkpoint', default='',
                    help='a real checkpoint (folder or name, e.g. metaworld-demo) instead of '
                    'the preset with random weights; its tokenizer and dataset statistics')
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--dtype', default='bfloat16' if torch.cuda.is_available() else 'float32')
    ap.add_argument('--frames', type=int, default=20)
    ap.add_argument('--warmup', type=int, default=8)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--graphs', default='off,on' if torch.cuda.is_available() else 'off',
                    help='CUDA graph settings to run: off, on or off,on')
    ap.add_argument('--streams', default='1,4')
    ap.add_argument('--max-prefills-per-step', default='1',
                    help='comma-separated EngineConfig.max_prefills_per_step settings of the '
                    'pipelined rows (several only matter with several streams)')
    ap.add_argument('--rows', default='ar,pipeline,oracle',
                    help='row groups besides HF: ar, pipeline, oracle (spec modes with the '
                    'oracle draft), eagle (spec modes with a random EAGLE head at the default '
                    'tree: acceptance near 1, it measures what drafting costs), temporal (spec '
                    'modes drafting the previous action, tree depth 5 / 6 nodes, on frames '
                    'each shown 4 times in a row), prefill (the same with speculative_prefill '
                    'on and off, on repeated and on episode-like frames)')
    ap.add_argument('--baselines', default='eager,compiled',
                    help='HF baselines: eager, compiled (static cache + torch.compile)')
    ap.add_argument('--compile-backend', default='inductor',
                    help='torch.compile backend of the compiled HF baseline (tests: eager)')
    ap.add_argument('--parts', default='table',
                    help='table, fidelity, profile, threads, kernels, attention, fp8, paced, '
                    'floor (any of)')
    ap.add_argument('--thread-sweep', default='16,4,1',
                    help='intra-op thread counts of the threads part')
    ap.add_argument('--fidelity-frames', type=int, default=200,
                    help='frames of the fidelity part and of the fp8 part\'s bin distance')
    ap.add_argument('--fidelity-kernels', default='off,on')
    ap.add_argument('--fidelity-action-only', action='store_true',
                    help='greedy over action tokens only, on both sides (random weights '
                    'rarely choose action tokens, so bin distances need it)')
    ap.add_argument('--paced-robots', default='1,2,4',
                    help='robot counts of the paced part (one camera per robot)')
    ap.add_argument('--paced-prefills', default='1,2,4',
                    help='max_prefills_per_step settings of the paced default rows (each up to '
                    'the robot count)')
    ap.add_argument('--camera-hz', type=float, default=25.0,
                    help='each robot\'s camera rate in the paced part')
    ap.add_argument('--paced-seconds', type=float, default=4.0,
                    help='timed camera seconds per paced row (after the warm-up frames)')
    ap.add_argument('--paced-warmup-frames', type=int, default=10,
                    help='frames per robot served but not counted at the start of a paced row')
    ap.add_argument('--profile-mode', default='pipeline_spec@3.0')
    ap.add_argument('--weight-dtype', default='auto', choices=('auto', 'fp8'),
                    help='the decoder weights of every runner (fp8: quantised at load; with '
                    'the table or fidelity parts the HF baselines would copy FP8 weights, so '
                    'use it with --baselines "" and parts that build no baseline, e.g. paced)')
    ap.add_argument('--floor-forwards', type=int, default=20,
                    help='eager decode forwards profiled by the floor part')
    ap.add_argument('--out', default=str(Path(__file__).parent / 'results'))
    ap.add_argument('--progress-file', default='',
                    help='rewrite this JSON after every timed row of the table and paced '
                         'parts (kept if the run is cut; bench/gpu_progress.py)')
    args = ap.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        print('--device cuda requested but CUDA is not available', file=sys.stderr)
        return 2
    parts = set(args.parts.split(','))
    if args.weight_dtype == 'fp8' and args.baselines.strip():
        print('--weight-dtype fp8 needs --baselines "" (the HF baselines copy the runner\'s '
              'weights)', file=sys.stderr)
        return 2
    unknown = parts - {'table', 'fidelity', 'profile', 'threads', 'kernels', 'attention',
                       'fp8', 'paced', 'floor'}
    if unknown:
        print(f'--parts: unknown {sorted(unknown)}', file=sys.stderr)
        return 2
    baseline_names = [v for v in args.baselines.split(',') if v]
    if parts & {'table', 'fidelity'} and 'eager' not in baseline_names:
        print('--baselines: the table and fidelity parts compare with HF eager: include eager',
              file=sys.stderr)
        return 2
    weights = load_checkpoint(args.checkpoint, args.device, args.dtype) if args.checkpoint \
        else build_model(args.preset, args.device, args.dtype, args.seed)
    key = sorted(weights.norm_stats)[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    report = {'checks': {}, 'pieces_ms': {}, 'failures': []}
    # The HF baselines are built first, before any graph capture, on an eager runner of the
    # same weights (its weights are copied into transformers' Llama).
    from vla_spec_ros.models.openvla.baseline import HFBaseline
    eager_runner = build_runner(weights, engine_options(args, False))
    engine_cfg = EngineConfig(device=args.device, dtype=args.dtype)
    baselines, hf_model = {}, None
    for variant in baseline_names:
        baseline = HFBaseline(eager_runner, engine_cfg, variant=variant, hf_model=hf_model,
                              compile_backend=args.compile_backend)
        hf_model = baseline.model                  # one weight copy for both baselines
        baselines[baseline.label] = baseline
    progress = ProgressFile(args.progress_file)     # what a run cut short leaves behind
    records = run_table(args, weights, key, baselines, report, progress) \
        if 'table' in parts else []
    paced = run_paced_part(args, weights, key, progress.set_paced) \
        if 'paced' in parts else {}
    threads = run_thread_sweep(args, weights, key) \
        if 'threads' in parts else {}
    kernel_ab = run_ab(args, weights, key, 'kernels') \
        if 'kernels' in parts else {}
    attention_ab = run_ab(args, weights, key, 'attention') \
        if 'attention' in parts else {}
    fidelity = run_fidelity(args, weights, key, baselines['hf']) \
        if 'fidelity' in parts else {}
    fp8 = run_fp8(args, weights, key) \
        if 'fp8' in parts else {}
    profiled = run_profile(args, weights, key, out, stamp) \
        if 'profile' in parts else {}
    decode_floor = run_decode_floor(args, weights, key) if 'floor' in parts else {}
    table = format_table(records) if records else ''
    from gpu_fidelity import format_histogram_rows
    fidelity_table = format_histogram_rows(fidelity) if fidelity else ''
    fp8_table = format_fp8(fp8) if fp8 else ''
    paced_table = format_paced(paced['rows']) if paced else ''
    print(table)
    print(paced_table)
    print(fidelity_table)
    print(fp8_table)
    command = 'python bench/gpu.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    record = {'command': command, 'preset': args.preset, 'device': args.device,
              'dtype': args.dtype, 'environment': environment(), **report,
              'floor_ms': FLOOR_MS, 'rows': records, 'fidelity': fidelity,
              'profile': profiled, 'threads': threads, 'kernels_ab': kernel_ab,
              'attention_ab': attention_ab, 'fp8': fp8, 'paced': paced,
              'decode_floor': decode_floor}
    label = Path(args.checkpoint).name if args.checkpoint else args.preset
    name = f'gpu-{label}-{args.device}-{stamp}'
    (out / f'{name}.json').write_text(json.dumps(record, indent=2))
    (out / f'{name}.md').write_text(
        f'command: `{command}`\n\n{json.dumps(record["environment"])}\n\n'
        f'token agreement with the plain AR reference: {report["checks"]}\n\n'
        f'ms per piece (median): {json.dumps(report["pieces_ms"])}\n\n'
        f'failures: {report["failures"]}\n\n{table}\n\n'
        + (f'bin distance against HF eager, {args.fidelity_frames} frames:\n\n'
           f'{fidelity_table}\n' if fidelity else '')
        + (f'\nrobots paced at {args.camera_hz:g} Hz each (one robot\'s floor: vision+prompt '
           f'+ one prefill = {paced["floor_ms"]:.2f} ms):\n\n{paced_table}\n' if paced else '')
        + (f'\nweight_dtype fp8 against auto ({args.fidelity_frames} frames for the bin '
           f'distance):\n\n{fp8_table}\n' if fp8 else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
