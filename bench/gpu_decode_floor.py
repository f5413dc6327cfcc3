"""The ``floor`` part of bench/gpu.py: one decode forward (1 row) against the least it can
cost, and where the rest goes.

- The floor: the bytes a decode forward must read (every decoder weight and the LM head once;
  the embedding table contributes one row) over the copy bandwidth measured in the same run
  (bytes read plus written by a 1 GiB device-to-device copy).
- The decode forward: the model's ``decode_1`` step (bench/gpu_setup.time_pieces' step),
  replayed as a CUDA graph and run eagerly; the ratio to the floor is the issue's target
  (<= 1.3x).
- Where the time goes: torch.profiler over ``--floor-forwards`` eager decode forwards, each
  device kernel put in a category by its name (matrix products, attention, norms, RoPE / KV
  write, activation, quantisation, copies and indexing, other): per forward the kernels' count
  and device time, and how far the graphed forward is above the sum of its kernels (gaps
  between kernels that a graph does not remove).

On the CPU (the smoke check of this script) there is no bandwidth or device time: the part
prints the forward's wall time and the CPU operator table only.
"""
from __future__ import annotations

import re

import numpy as np
import torch

from vla_spec_ros.bench import make_frames
from vla_spec_ros.config import EngineConfig

from gpu_setup import build_runner, decode_steps, engine_options, median_ms

CATEGORIES = (
    ('matmul', r'gemm|gemv|cutlass|xmma|nvjet|matmul|_mm_|sm90_|ampere_|scaled_mm|fp8_gemv'),
    ('attention', r'attention|attn|flash|sdpa|softmax|segment'),
    ('norm', r'rms|norm'),
    ('rope+kv', r'rope|kv_write'),
    ('activation', r'silu|gelu|act_and_mul|swiglu'),
    ('quantisation', r'quant'),
    ('copy/index', r'copy|memcpy|memset|index|gather|scatter|cat|fill'),
)


def category(name: str) -> str:
    lowered = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, lowered):
            return label
    return 'other'


def copy_bandwidth_GBps(device, nbytes: int = 1 << 30) -> float:
    """Bytes read plus written per second by a device-to-device copy (median of 10)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / float(np.median(times)) / 1e9


def decode_bytes(model) -> int:
    """Bytes one decode forward must read: the language model's parameters and buffers, each
    storage once, the input embedding table as one row unless the LM head shares it (tied
    embeddings: the head reads all of it)."""
    lm = model.language_model
    embed = lm.model.embed_tokens.weight
    tied = lm.lm_head.weight.data_ptr() == embed.data_ptr()
    seen, total = set(), 0
    for t in list(lm.parameters()) + list(lm.buffers()):
        if t.data_ptr() in seen or (t.data_ptr() == embed.data_ptr() and not tied):
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total + (0 if tied else embed.shape[1] * embed.element_size())


def decode_step(runner, frame, options):
    """A ring and the one-row decode step after ``frame``'s prompt (time_pieces' decode_1)."""
    ring = runner.new_ring(4096, EngineConfig(**options))
    length = runner.prepare_prompt(frame, EngineConfig(**options)).embeds.shape[0]
    return ring, decode_steps(ring, length, 1)


def kernels_by_category(prof, forwards: int) -> dict:
    """Per forward, from a CUDA profile of ``forwards`` forwards: each category's kernel
    count and device µs, the 25 costliest kernels, and the kernels' total ms and count."""
    groups, kernels = {}, []
    for event in prof.key_averages():
        device_us = event.self_device_time_total
        if device_us <= 0 or event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        group = groups.setdefault(category(event.key), {'count': 0, 'us': 0.0})
        group['count'] += event.count / forwards
        group['us'] += device_us / forwards
        kernels.append((device_us / forwards, event.count / forwards, event.key[:90]))
    return {'categories': groups,
            'top_kernels': [{'us': us, 'per_forward': n, 'name': name}
                            for us, n, name in sorted(kernels, reverse=True)[:25]],
            'kernel_ms_per_forward': sum(g['us'] for g in groups.values()) / 1e3,
            'kernels_per_forward': sum(g['count'] for g in groups.values())}


def run_decode_floor(args, weights, key) -> dict:
    device = weights.model.language_model.lm_head.weight.device
    cuda = device.type == 'cuda'
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    frame = make_frames(1, weights.cfg.image_size, args.seed, key)[0]
    out = {'bytes': decode_bytes(weights.model)}
    if cuda:
        out['copy_GBps'] = copy_bandwidth_GBps(device)
        out['floor_ms'] = out['bytes'] / (out['copy_GBps'] * 1e9) * 1e3
    for graphs in ((True, False) if cuda else (False,)):       # eager last: it is profiled
        runner = build_runner(weights, engine_options(args, graphs))
        ring, step = decode_step(runner, frame, engine_options(args, graphs))
        out[f'decode_ms_graphs_{"on" if graphs else "off"}'] = median_ms(
            lambda: ring.run(step, []), sync, repeats=30)
    if cuda:
        out['decode_over_floor'] = out['decode_ms_graphs_on'] / out['floor_ms']
    # Where the eager forward's device time goes (the last ring: graphs off, warmed up).
    from torch.profiler import ProfilerActivity, profile
    forwards = args.floor_forwards
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(forwards):
            ring.run(step, [])
        sync()
    if cuda:
        out.update(kernels_by_category(prof, forwards))
        out['graph_gap_ms'] = out['decode_ms_graphs_on'] - out['kernel_ms_per_forward']
    else:
        out['cpu_table'] = prof.key_averages().table(sort_by='self_cpu_time_total',
                                                     row_limit=15)
    print(format_decode_floor(out), flush=True)
    return out


def format_decode_floor(out: dict) -> str:
    lines = [f'decode forward reads {out["bytes"] / 1e9:.2f} GB']
    if 'floor_ms' in out:
        lines.append(f'copy bandwidth {out["copy_GBps"]:.0f} GB/s -> floor {out["floor_ms"]:.2f}'
                     f' ms; decode graphed {out["decode_ms_graphs_on"]:.2f} ms '
                     f'({out["decode_over_floor"]:.2f}x the floor), eager '
                     f'{out["decode_ms_graphs_off"]:.2f} ms; kernels '
                     f'{out["kernel_ms_per_forward"]:.2f} ms in '
                     f'{out["kernels_per_forward"]:.0f} launches per forward, graphed forward '
                     f'minus kernels {out["graph_gap_ms"]:.2f} ms')
        lines += ['', '| category | kernels / forward | us / forward | share |',
                  '|---|---|---|---|']
        total = sum(g['us'] for g in out['categories'].values()) or 1.0
        for label, g in sorted(out['categories'].items(), key=lambda kv: -kv[1]['us']):
            lines.append(f'| {label} | {g["count"]:.0f} | {g["us"]:.0f} | '
                         f'{100 * g["us"] / total:.0f} % |')
        lines += ['', '| us / forward | calls / forward | kernel |', '|---|---|---|']
        lines += [f'| {k["us"]:.1f} | {k["per_forward"]:.0f} | `{k["name"]}` |'
                  for k in out['top_kernels']]
    else:
        lines.append(f'decode eager {out["decode_ms_graphs_off"]:.2f} ms (CPU)')
    return '\n'.join(lines)
