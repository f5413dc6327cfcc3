"""The optional parts of bench/gpu.py (``--parts``), each on the weights the table uses:
bf16 fidelity against HF eager, the host-thread sweep, two A/B comparisons (fused kernels off
vs on; segment attention gathered vs read in place by the ring kernel), FP8 weights against
the model dtype (speed and bin distance), and one torch.profiler run."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import os

import numpy as np
import torch

from gpu_setup import (build_runner, eager_reference, engine_for, engine_options,
                       graphs_setting, run_all, second_copy, time_pieces)
from vla_spec_ros.baseline import generate_tokens
from vla_spec_ros.bench import bench_engine, make_frames
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine


def run_fidelity(args, weights, key, hf) -> dict:
    """Bin-distance histograms of every mode (kernels off / on) against HF eager, and of the
    fast modes against our own AR in the same setting. Spec modes draft with the checkpoint's
    EAGLE head at the default tree when there is one, else with the oracle chain draft at
    acceptance 3."""
    from gpu_fidelity import bin_distance_histogram, tokens_per_frame
    frames = make_frames(args.fidelity_frames, weights.cfg.image_size, args.seed + 1000, key)
    action_only = args.fidelity_action_only
    if action_only:         # random weights rarely pick action tokens: restrict both sides
        from vla_spec_ros.models.openvla.baseline import HFBaseline
        hf = HFBaseline(hf.runner, hf.engine_config, hf_model=hf.model,
                        action_tokens_only=True)
    hf_tokens = [tuple(generate_tokens(hf, f.image, f.instruction)) for f in frames]
    use_graphs = graphs_setting(args, 0)
    results = {}
    for kernels in args.fidelity_kernels.split(','):
        options = engine_options(args, use_graphs, use_kernels=kernels,
                                 restrict_to_action_tokens=action_only)
        runner = build_runner(weights, options)
        at = runner.codec
        ref = None
        setting = (f'kernels={kernels} graphs={"on" if use_graphs else "off"}'
                   + (' action tokens only' if action_only else ''))
        for mode in ('ar', 'pipeline', 'spec', 'pipeline_spec'):
            label = f'{mode} {setting}'
            if ref is None and mode in ('spec', 'pipeline_spec') and weights.source is None:
                results[label] = 'no AR tokens for the oracle draft (ar failed)'
                continue
            try:
                got = tokens_per_frame(run_all(_fidelity_engine(runner, weights, mode, ref,
                                                                options, args.seed), frames))
            except RuntimeError as exc:
                results[label] = str(exc)
                continue
            if mode == 'ar':
                ref = got          # the oracle drafts this setting's own AR tokens
            results[label] = bin_distance_histogram(got, hf_tokens, at.first_action_id,
                                                    at.last_action_id)
            print(label, results[label], flush=True)
            if mode != 'ar' and ref is not None:
                results[f'{mode} vs our ar, {setting}'] = bin_distance_histogram(
                    got, ref, at.first_action_id, at.last_action_id)
    return results


def _fidelity_engine(runner, weights, mode: str, ref, options: dict, seed: int):
    """Spec modes draft with the checkpoint's head when there is one, else the oracle."""
    if mode in ('ar', 'pipeline'):
        return engine_for(runner, weights, mode, options)
    if weights.source is not None:
        cfg = EngineConfig(mode=mode, draft_path='checkpoint', **options)
        return Engine(runner, weights.norm_stats, cfg)
    return engine_for(runner, weights, f'{mode}@3.0', options, ref, seed)


def run_thread_sweep(args, weights, key) -> dict:
    """Host threads against step cost: the model pieces and a pipeline row (CUDA graphs as
    the last ``--graphs`` setting, 1 stream) at each ``--thread-sweep`` intra-op thread count.
    The host's share of a step (preprocessing, launches) is small arithmetic on which many
    threads can cost more than they save."""
    options = engine_options(args, graphs_setting(args, -1))
    runner = build_runner(weights, options)
    frames = make_frames(args.frames + args.warmup, weights.cfg.image_size, args.seed, key)
    previous = torch.get_num_threads()
    out = {}
    try:
        for threads in [int(t) for t in args.thread_sweep.split(',')]:
            torch.set_num_threads(threads)
            pieces = time_pieces(runner, make_frames(2, weights.cfg.image_size, 3, key), options)
            row = bench_engine(engine_for(runner, weights, 'pipeline', options), frames,
                               args.warmup)
            out[threads] = {'pieces_ms': pieces, 'pipeline': asdict(row)}
            print(f'threads {threads}: pieces {pieces}; pipeline {row.actions_per_s:.1f} '
                  f'actions/s, {row.step_ms:.2f} ms/step, vision {row.vision_ms:.2f} / '
                  f'verifier {row.verifier_ms:.2f} / host {row.host_ms:.2f} ms/step', flush=True)
    finally:
        torch.set_num_threads(previous)
    return out


# The A/B parts: label -> the options each side adds (same weights, same process).
AB_SETTINGS = {
    'kernels': {'off': {'use_kernels': 'off'}, 'on': {'use_kernels': 'on'}},
    # Fused kernels on for both sides: the segments' gather + SDPA against the ring kernel.
    'attention': {'segments': {'use_kernels': 'on', 'attention_backend': 'segments'},
                  'ring': {'use_kernels': 'on', 'attention_backend': 'ring'}},
}


def run_ab(args, weights, key, part: str) -> dict:
    """One setting, then the other (``AB_SETTINGS[part]``; same weights, same process, CUDA
    graphs as the last ``--graphs`` setting, 1 stream): the model pieces, then the ar /
    pipeline / pipeline_spec@3.5 rows, with the share of frames whose tokens equal the eager
    AR reference of the setting (in bf16 a different kernel may round a near tie the other
    way: read it beside the fidelity part)."""
    frames = make_frames(args.frames + args.warmup, weights.cfg.image_size, args.seed, key)
    out = {}
    for label, extra in AB_SETTINGS[part].items():
        options = engine_options(args, graphs_setting(args, -1), **extra)
        runner = build_runner(weights, options)
        pieces = time_pieces(runner, make_frames(2, weights.cfg.image_size, 3, key), options)
        ref = eager_reference(runner, frames, options)
        rows = {}
        for mode in ('ar', 'pipeline', 'pipeline_spec@3.5'):
            engine = engine_for(runner, weights, mode, options, ref, args.seed)
            row = bench_engine(engine, frames, args.warmup)
            # A fresh engine: the oracle drafter looks the reference up by request id, which
            # the timed engine's ids have moved past. The timed one is freed first (one ring
            # and one set of graphs alive at a time).
            del engine
            got = [fin.result.tokens for fin in run_all(
                engine_for(runner, weights, mode, options, ref, args.seed), frames)]
            agreement = float(np.mean([a == b for a, b in zip(got, ref)]))
            rows[mode] = {**asdict(row), 'reference_agreement': agreement}
            print(f'{part} {label} {mode}: {row.actions_per_s:.2f} actions/s, '
                  f'{row.step_ms:.2f} ms/step (vision {row.vision_ms:.2f}, verifier '
                  f'{row.verifier_ms:.2f}, host {row.host_ms:.2f}), p50 '
                  f'{row.latency_p50_ms:.1f} ms, frames with the reference tokens: '
                  f'{agreement:.0%}',
                  flush=True)
        out[label] = {'options': extra, 'pieces_ms': pieces, 'rows': rows}
        print(f'{part} {label}: pieces {pieces}', flush=True)
    return out


FP8_MODES = ('ar', 'pipeline', 'pipeline_spec@3.5')


def run_fp8(args, weights, key) -> dict:
    """``weight_dtype`` auto (the given weights), then fp8 (a second copy of them, its decoder
    quantised at load, freed after its side), CUDA graphs as the last ``--graphs`` setting,
    1 stream: per side the model pieces and the ar / pipeline / pipeline_spec@3.5 rows (each
    with the share of frames equal to its side's own eager AR reference), then the AR tokens
    of ``--fidelity-frames`` frames (greedy over action tokens only with
    ``--fidelity-action-only``); fp8's step time over auto's per mode, and the bin distance
    of fp8's tokens from auto's (0 / 1 / 2 / 3+ bins). fp8 runs the default route
    (models/fp8.py ``PRODUCT``, the norms and the activation quantising for the products and
    applying the previous products' scales); ``fp8-unfused`` the same with each product
    quantising its own input and scaling its own output (``QUANTIZE_IN_PRODUCERS`` and
    ``SCALES_IN_CONSUMERS`` off: the route before them); ``fp8-rowwise`` (only when named in
    FP8_SIDES) the row-wise ``_scaled_mm``. The same function by every route, so only their
    speed is recorded."""
    from vla_spec_ros.models import fp8 as fp8_model
    from gpu_fidelity import bin_distance_histogram, tokens_per_frame
    size = weights.cfg.image_size
    frames = make_frames(args.frames + args.warmup, size, args.seed, key)
    fidelity_frames = make_frames(args.fidelity_frames, size, args.seed + 1000, key)
    use_graphs = graphs_setting(args, -1)
    out, tokens = {'sides': {}}, {}
    default_product = fp8_model.PRODUCT
    # FP8_SIDES (environment) trims or widens the sides, e.g. "auto,fp8" for a short run.
    sides = os.environ.get('FP8_SIDES', 'auto,fp8,fp8-unfused').split(',')
    for label in sides:
        weight_dtype = 'auto' if label == 'auto' else 'fp8'
        # The route and the producers' quantisation are read at the runner's build.
        fp8_model.PRODUCT = 'rowwise' if label == 'fp8-rowwise' else default_product
        fused = label != 'fp8-unfused'
        fp8_model.QUANTIZE_IN_PRODUCERS = fp8_model.SCALES_IN_CONSUMERS = fused
        side = weights if label == 'auto' else second_copy(args, weights, weight_dtype)
        options = engine_options(args, use_graphs, weight_dtype=weight_dtype)
        try:
            runner = build_runner(side, options)
        finally:
            fp8_model.PRODUCT = default_product
            fp8_model.QUANTIZE_IN_PRODUCERS = fp8_model.SCALES_IN_CONSUMERS = True
        pieces = time_pieces(runner, make_frames(2, size, 3, key), options)
        ref = eager_reference(runner, frames, options)
        rows = {}
        for mode in FP8_MODES:
            engine = engine_for(runner, side, mode, options, ref, args.seed)
            row = bench_engine(engine, frames, args.warmup)
            del engine          # one ring and one set of graphs alive at a time (run_ab)
            got = [fin.result.tokens for fin in run_all(
                engine_for(runner, side, mode, options, ref, args.seed), frames)]
            rows[mode] = {**asdict(row), 'reference_agreement':
                          float(np.mean([a == b for a, b in zip(got, ref)]))}
            print(f'fp8 part, weight_dtype {label} {mode}: {row.actions_per_s:.2f} actions/s, '
                  f'{row.step_ms:.2f} ms/step (verifier {row.verifier_ms:.2f}), p50 '
                  f'{row.latency_p50_ms:.1f} ms, frames with the reference tokens: '
                  f'{rows[mode]["reference_agreement"]:.0%}', flush=True)
        if label in ('auto', 'fp8'):
            fidelity_options = dict(options,
                                    restrict_to_action_tokens=args.fidelity_action_only)
            tokens[label] = tokens_per_frame(run_all(
                engine_for(runner, side, 'ar', fidelity_options), fidelity_frames))
        out['sides'][label] = {'pieces_ms': pieces, 'rows': rows}
        codec = runner.codec
        print(f'fp8 part, weight_dtype {label}: pieces {pieces}', flush=True)
        del runner, side
    out['step_ms_ratio'] = {mode: out['sides']['fp8']['rows'][mode]['step_ms']
                            / out['sides']['auto']['rows'][mode]['step_ms']
                            for mode in FP8_MODES}
    # The other FP8 routes' step times over auto's, per side.
    out['step_ms_ratio_by_side'] = {
        label: {mode: out['sides'][label]['rows'][mode]['step_ms']
                / out['sides']['auto']['rows'][mode]['step_ms'] for mode in FP8_MODES}
        for label in out['sides'] if label not in ('auto', 'fp8')}
    out['pieces_ratio'] = {label: {piece: ms / out['sides']['auto']['pieces_ms'][piece]
                                   for piece, ms in out['sides'][label]['pieces_ms'].items()}
                           for label in out['sides'] if label != 'auto'}
    out['bin_distance'] = bin_distance_histogram(tokens['fp8'], tokens['auto'],
                                                 codec.first_action_id, codec.last_action_id)
    out['action_tokens_only'] = bool(args.fidelity_action_only)
    print(f'fp8 / auto step time: {out["step_ms_ratio"]}; bin distance of fp8 from auto '
          f'({args.fidelity_frames} frames): {out["bin_distance"]}', flush=True)
    return out


def format_fp8(result: dict) -> str:
    """Markdown: per mode the step time and rate of each side and their ratio, then the bin
    distance row."""
    from gpu_fidelity import format_histogram_rows
    auto, fp8 = (result['sides'][label]['rows'] for label in ('auto', 'fp8'))
    others = result.get('step_ms_ratio_by_side', {})
    lines = ['| mode | auto ms/step | fp8 ms/step | fp8 / auto | '
             + ''.join(f'{label} / auto | ' for label in others)
             + 'auto actions/s | fp8 actions/s | fp8 frames = its AR |',
             '|---|---|---|---|' + '---|' * len(others) + '---|---|---|']
    for mode in FP8_MODES:
        lines.append(f'| {mode} | {auto[mode]["step_ms"]:.2f} | {fp8[mode]["step_ms"]:.2f} | '
                     f'{result["step_ms_ratio"][mode]:.2f} | '
                     + ''.join(f'{ratios[mode]:.2f} | ' for ratios in others.values())
                     + f'{auto[mode]["actions_per_s"]:.2f} '
                     f'| {fp8[mode]["actions_per_s"]:.2f} | '
                     f'{100 * fp8[mode]["reference_agreement"]:.0f} % |')
    if 'pieces_ratio' in result:
        labels = ' | '.join(f'{label} / auto' for label in result['pieces_ratio'])
        lines += ['', f'| piece | {labels} |',
                  '|---|' + '---|' * len(result['pieces_ratio'])]
        for piece in ('prefill', 'decode_1', 'decode_8x1'):
            lines.append(f'| {piece} | ' + ' | '.join(
                f'{ratios.get(piece, float("nan")):.2f}'
                for ratios in result['pieces_ratio'].values()) + ' |')
    label = 'fp8 AR vs auto AR' + (', action tokens only' if result['action_tokens_only']
                                   else '')
    return '\n'.join(lines) + '\n\n' + format_histogram_rows({label: result['bin_distance']})


def run_profile(args, weights, key, out: Path, stamp: str) -> dict:
    """torch.profiler over one mode (1 stream): the kernel table by device time."""
    from torch.profiler import ProfilerActivity, profile
    use_graphs = graphs_setting(args, -1)
    options = engine_options(args, use_graphs)
    runner = build_runner(weights, options)
    frames = make_frames(args.warmup + 8, weights.cfg.image_size, args.seed, key)
    mode = args.profile_mode
    ref = eager_reference(runner, frames, options) if '@' in mode else None
    engine = engine_for(runner, weights, mode, options, ref, args.seed)
    engine.capture_graphs(frames[0])
    run_all(engine, frames[:args.warmup])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if runner.device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        run_all(engine, frames[args.warmup:])
        if runner.device.type == 'cuda':
            torch.cuda.synchronize()
    sort = 'self_device_time_total' if runner.device.type == 'cuda' else 'self_cpu_time_total'
    table = prof.key_averages().table(sort_by=sort, row_limit=40)
    path = out / f'profile-{args.preset}-{mode.replace("@", "_at_")}-{stamp}.txt'
    path.write_text(f'mode {mode}, graphs {"on" if use_graphs else "off"}, 8 frames, '
                    f'1 stream\n\n{table}\n')
    print(table, flush=True)
    return {'mode': mode, 'graphs': use_graphs, 'table_file': path.name}
