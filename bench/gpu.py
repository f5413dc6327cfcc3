"""One-command speed benchmark: eager checks, then HF AR vs our modes, in the same run.

    python bench/gpu.py --preset openvla-7b --device cuda --dtype bfloat16   # the GPU target
    python bench/gpu.py --preset tiny --device cpu --dtype float32           # runs anywhere

Builds the preset with random weights directly on the device (no checkpoint), checks every fast
path against the eager AR reference on that device (token agreement; HF logits tolerance), then
times HF transformers AR (the baseline), our AR, pipeline, spec and pipeline_spec. Random
weights cannot train a draft head, so speculation uses an oracle draft that proposes the AR
tokens with a per-position error rate chosen to hit the acceptance lengths 1.5 / 2.0 / 3.0
(measured and printed). Each configuration runs with 1 and 4 camera streams. Prints a table and
writes JSON (+ a PNG plot when matplotlib is installed) to bench/results/.

The roofline columns use reference/anchors.md's H100 floor scaled to the preset: weight bytes
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

from vla_spec_ros.bench import BenchRow, bench_engine, bench_hf, environment, make_frames
from vla_spec_ros.config import EngineConfig, preset
from vla_spec_ros.engine.drafter import OracleDrafter
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.runner import TORCH_DTYPES, ModelRunner
from vla_spec_ros.models.checkpoint import init_random_
from vla_spec_ros.models.vla import OpenVLA
from vla_spec_ros.models.random_checkpoint import synthetic_norm_stats
from vla_spec_ros.prompt import PromptTokenizer, build_tokenizer

TARGET_ACCEPTANCE = (1.5, 2.0, 3.0)


def acceptance_error_rate(target: float, depth: int) -> float:
    """Per-position error rate e such that a chain of ``depth`` drafts yields ``target``
    tokens per verify on average: sum_{i=0..depth} (1 - e)^i = target (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        if sum(p ** i for i in range(depth + 1)) < target:
            lo = p
        else:
            hi = p
    return 1.0 - (lo + hi) / 2


def build_runner(name: str, device: str, dtype: str, seed: int) -> tuple[ModelRunner, dict]:
    cfg = preset(name)
    torch_dtype = TORCH_DTYPES[dtype]
    # Materialise directly on the device in the target dtype (no 30 GB float32 copy on host).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            torch.manual_seed(seed)
            model = OpenVLA(cfg)
            init_random_(model)
    finally:
        torch.set_default_dtype(previous)
    model = model.eval()
    engine_cfg = EngineConfig(device=device, dtype=dtype)
    # A real small tokenizer keeps the prompt path identical to a loaded checkpoint; the 7B
    # vocabulary is only needed for the embedding table size, not for the tokenizer.
    tokenizer = PromptTokenizer(build_tokenizer(min(cfg.pad_token_id, 1024), seed))
    return ModelRunner(model, cfg, tokenizer, engine_cfg), synthetic_norm_stats(cfg.action_dim)


def check_fast_paths(runner, norm_stats, frames, base: dict) -> dict:
    """Every mode's tokens vs the eager AR reference on this device; HF logits tolerance."""
    from vla_spec_ros.baseline import HFBaseline
    ar = Engine(runner, norm_stats, EngineConfig(mode='ar', **base))
    for f in frames:
        ar.submit(f)
    reference = {fin.request_id: fin.result.tokens for fin in ar.run_until_idle()}
    ref_list = [reference[i] for i in sorted(reference)]
    report = {}
    for mode in ('pipeline', 'spec', 'pipeline_spec'):
        draft = OracleDrafter(lambda rid: ref_list[rid], runner.action_dim, 0.3, seed=1) \
            if mode != 'pipeline' else None
        engine = Engine(runner, norm_stats, EngineConfig(mode=mode, tree_depth=5,
                                                         tree_top_k=1, tree_max_nodes=6,
                                                         **base), draft=draft)
        for f in frames:
            engine.submit(f)
        got = {fin.request_id: fin.result.tokens for fin in engine.run_until_idle()}
        agree = np.mean([got[i] == ref_list[i] for i in range(len(ref_list))])
        report[mode] = float(agree)
    hf = HFBaseline(runner, EngineConfig(**base))
    hf_tokens = [tuple(hf.generate_tokens(f.image, f.instruction)) for f in frames]
    report['hf'] = float(np.mean([a == b for a, b in zip(hf_tokens, ref_list)]))
    return report


def roofline(runner, row: BenchRow, device: str) -> dict:
    params = sum(p.numel() for p in runner.model.parameters())
    nbytes = params * next(runner.model.parameters()).element_size()
    # FLOPs of one action: every weight is used once per token of prefill + 6 decodes.
    num_tokens = runner.cfg.num_patches + 20 + runner.action_dim - 1
    flops_per_action = 2 * params * num_tokens
    forwards_per_s = row.forwards_per_action * row.actions_per_s \
        if np.isfinite(row.forwards_per_action) else 7 * row.actions_per_s
    return {'params': params, 'bandwidth_GBps': forwards_per_s * nbytes / 1e9,
            'tflops': row.actions_per_s * flops_per_action / 1e12}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--preset', default='tiny')
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--dtype', default='bfloat16' if torch.cuda.is_available() else 'float32')
    ap.add_argument('--frames', type=int, default=20)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--out', default=str(Path(__file__).parent / 'results'))
    args = ap.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        print('--device cuda requested but CUDA is not available', file=sys.stderr)
        return 2
    runner, norm_stats = build_runner(args.preset, args.device, args.dtype, args.seed)
    key = sorted(norm_stats)[0]
    base = dict(device=args.device, dtype=args.dtype)
    checks = check_fast_paths(runner, norm_stats,
                              make_frames(4, runner.cfg.image_size, args.seed + 7, key), base)
    print('token agreement with eager AR on this device:', checks)
    rows: list[tuple[str, int, BenchRow]] = []
    for streams in (1, 4):
        frames = make_frames(args.frames + args.warmup, runner.cfg.image_size, args.seed, key,
                             streams)
        ar = Engine(runner, norm_stats, EngineConfig(mode='ar', **base))
        # bench_engine submits the warmup frames first, so request ids index ``ref`` directly.
        ref = [tuple(r.result.tokens) for r in _run_all(ar, frames)]
        from vla_spec_ros.baseline import HFBaseline
        rows.append(('hf', streams, bench_hf(HFBaseline(runner, EngineConfig(**base)), frames,
                                             args.warmup)))
        for mode in ('ar', 'pipeline'):
            rows.append((mode, streams, bench_engine(
                Engine(runner, norm_stats, EngineConfig(mode=mode, **base)), frames,
                args.warmup)))
        depth = runner.action_dim - 2
        for target in TARGET_ACCEPTANCE:
            for mode in ('spec', 'pipeline_spec'):
                draft = OracleDrafter(ref.__getitem__, runner.action_dim,
                                      acceptance_error_rate(target, depth), seed=args.seed)
                cfg = EngineConfig(mode=mode, tree_depth=depth, tree_top_k=1,
                                   tree_max_nodes=depth + 1, **base)
                row = bench_engine(Engine(runner, norm_stats, cfg, draft=draft), frames,
                                   args.warmup)
                row.mode = f'{mode}@{target}'
                rows.append((row.mode, streams, row))
    for streams in (1, 4):
        hf = next(r for m, s, r in rows if m == 'hf' and s == streams)
        for m, s, r in rows:
            if s == streams:
                r.ratio_vs_hf = r.actions_per_s / hf.actions_per_s
                r.latency_ratio_vs_hf = r.latency_p50_ms / hf.latency_p50_ms
    lines = ['| mode | streams | actions/s | ×HF | p50 ms | p99 ms | p50 ×HF | fwd/action | '
             'accept len | GB/s | TFLOP/s |', '|' + '---|' * 11]
    records = []
    for m, s, r in rows:
        rf = roofline(runner, r, args.device)
        records.append({'streams': s, **asdict(r), **rf})
        lines.append(f'| {m} | {s} | {r.actions_per_s:.2f} | {r.ratio_vs_hf:.2f} | '
                     f'{r.latency_p50_ms:.1f} | {r.latency_p99_ms:.1f} | '
                     f'{r.latency_ratio_vs_hf:.2f} | {r.forwards_per_action:.2f} | '
                     f'{r.acceptance_length:.2f} | {rf["bandwidth_GBps"]:.1f} | '
                     f'{rf["tflops"]:.3f} |')
    table = '\n'.join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    command = 'python bench/gpu.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    record = {'command': command, 'preset': args.preset, 'device': args.device,
              'dtype': args.dtype, 'environment': environment(), 'checks': checks,
              'rows': records}
    (out / f'gpu-{args.preset}-{args.device}-{stamp}.json').write_text(
        json.dumps(record, indent=2))
    (out / f'gpu-{args.preset}-{args.device}-{stamp}.md').write_text(
        f'command: `{command}`\n\n{json.dumps(record["environment"])}\n\n'
        f'checks: {checks}\n\n{table}\n')
    return 0


def _run_all(engine, frames):
    for f in frames:
        engine.submit(f)
    out = engine.run_until_idle()
    return sorted(out, key=lambda fin: fin.request_id)


if __name__ == '__main__':
    sys.exit(main())
