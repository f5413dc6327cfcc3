"""Where an FP8 projection's time goes, against bf16's, on the 7B decoder's shapes.

The H200 measured ``weight_dtype: fp8`` at 0.98-1.03x bf16's step time, although its weights
are half the bytes (bench/README.md, second H200 run). This script times, per projection shape
of the OpenVLA-7B decoder and per number of rows (1 = AR decode, 8 = a pipelined decode step,
64 = verification trees, 280 = a prefill):

- ``bf16``: ``F.linear`` with bf16 weights (what ``auto`` runs);
- ``quant``: the per-token activation quantisation alone (``quantize_rows_triton``);
- ``scaled_mm``: ``torch._scaled_mm`` alone on already quantised activations, row-wise scales
  (what ``fp8`` runs after ``quant``), and with ``use_fast_accum``;
- ``per-tensor``: ``_scaled_mm`` with one scale per tensor (not what the engine runs: whether
  the row-wise scaled kernel is the slow part);
- ``fp8``: the whole ``fp8_linear_scaled_mm`` (quant + scaled_mm);

each as device time per call (a CUDA graph of 20 calls replayed, so launch gaps do not count,
as in the engine's graphed steps), with the weights' streaming rate in GB/s. Every product is
checked against ``fp8_linear_ref`` first.

    python3 bench/fp8_products.py             # CUDA with FP8 tensor cores (sm_89+)
    python3 bench/fp8_products.py --smoke     # the script on CPU, small shapes, reference only
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from kernels_sweep import load_kernels

# (name, N, K): the decoder's products as the engine runs them (q/k/v and gate/up fused).
SHAPES_7B = [('qkv', 3 * 4096, 4096), ('o', 4096, 4096), ('gate_up', 2 * 11008, 4096),
             ('down', 4096, 11008)]
ROWS = [1, 8, 64, 280]
CALLS_PER_GRAPH = 20


def device_time_ms(fn, device) -> float:
    """Milliseconds per call: on CUDA, a graph of CALLS_PER_GRAPH calls replayed (the median
    of 10 replays), falling back to timing the calls themselves if capture fails; on the CPU,
    the median wall time of 5 calls."""
    if device.type != 'cuda':
        fn()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times)[len(times) // 2]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(CALLS_PER_GRAPH):
                fn()
        run, calls = graph.replay, CALLS_PER_GRAPH
    except Exception:            # noqa: BLE001 - e.g. an op that cannot be captured
        torch.cuda.synchronize()
        run, calls = fn, 1
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def time_shape(kernels, name: str, n: int, k: int, rows: int, device, dtype) -> dict:
    """One row of the table: each variant's ms per call and the weights' GB/s."""
    gen = torch.Generator(device='cpu').manual_seed(n * 7 + k + rows)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(device=device, dtype=dtype)
    x = torch.randn(rows, k, generator=gen).to(device=device, dtype=dtype)
    wq, w_scale = kernels.quantize_rows(w)
    wq, w_scale = wq.contiguous(), w_scale.reshape(-1).contiguous()
    reference = kernels.fp8_linear_ref(x, wq, w_scale).float()
    out = {'product': name, 'N': n, 'K': k, 'rows': rows}
    out['bf16'] = device_time_ms(lambda: F.linear(x, w), device)
    can_fp8 = kernels.scaled_mm_unsupported_reason(wq, dtype) is None
    if can_fp8:
        xq, x_scale = kernels.quantize_rows_triton(x) if kernels.HAS_TRITON \
            else kernels.quantize_rows(x)
        got = kernels.fp8_linear_scaled_mm(x, wq, w_scale).float()
        tolerance = 2e-2 * reference.abs().max().item() + 1e-3
        out['ok'] = bool((got - reference).abs().max().item() <= tolerance)
        out['quant'] = device_time_ms(lambda: kernels.quantize_rows_triton(x), device)
        w_t, s_b = wq.t(), w_scale.view(1, -1)
        out['scaled_mm'] = device_time_ms(lambda: torch._scaled_mm(
            xq, w_t, scale_a=x_scale, scale_b=s_b, out_dtype=dtype), device)
        out['fast_accum'] = device_time_ms(lambda: torch._scaled_mm(
            xq, w_t, scale_a=x_scale, scale_b=s_b, out_dtype=dtype, use_fast_accum=True),
            device)
        one = torch.ones((), device=device)
        out['per_tensor'] = device_time_ms(lambda: torch._scaled_mm(
            xq, w_t, scale_a=one, scale_b=one, out_dtype=dtype), device)
        out['fp8'] = device_time_ms(lambda: kernels.fp8_linear_scaled_mm(x, wq, w_scale),
                                    device)
    else:       # the CPU smoke run: the reference stands in, so the script itself is checked
        out['ok'] = bool(torch.isfinite(reference).all())
        out['fp8'] = device_time_ms(lambda: kernels.fp8_linear_ref(x, wq, w_scale), device)
    bf16_bytes = n * k * w.element_size()
    out['bf16_GBps'] = bf16_bytes / out['bf16'] / 1e6
    out['fp8_GBps'] = n * k / out['fp8'] / 1e6
    return out


def format_rows(rows: list[dict]) -> str:
    columns = ['bf16', 'quant', 'scaled_mm', 'fast_accum', 'per_tensor', 'fp8']
    lines = ['| product | rows | ' + ' | '.join(f'{c} us' for c in columns)
             + ' | fp8 / bf16 | bf16 GB/s | fp8 GB/s | checked |',
             '|---|---|' + '---|' * (len(columns) + 4)]
    for r in rows:
        cells = [f'{1e3 * r[c]:.1f}' if c in r else '–' for c in columns]
        lines.append(f'| {r["product"]} {r["N"]}x{r["K"]} | {r["rows"]} | ' + ' | '.join(cells)
                     + f' | {r["fp8"] / r["bf16"]:.2f} | {r["bf16_GBps"]:.0f} | '
                     f'{r["fp8_GBps"]:.0f} | {"ok" if r["ok"] else "MISMATCH"} |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--smoke', action='store_true',
                        help='CPU, small shapes, the reference in place of _scaled_mm: checks '
                             'the script, timings meaningless')
    args = parser.parse_args(argv)
    kernels = load_kernels()
    if args.smoke:
        device, dtype = torch.device('cpu'), torch.float32
        shapes, rows_list = [('qkv', 96, 64), ('down', 64, 160)], [1, 8]
    else:
        if not torch.cuda.is_available():
            print('fp8_products: CUDA is required (use --smoke to check the script on CPU)')
            return 0
        device, dtype = torch.device('cuda'), torch.bfloat16
        shapes, rows_list = SHAPES_7B, ROWS
        print(f'device: {torch.cuda.get_device_name()}  torch {torch.__version__}', flush=True)
    rows = [time_shape(kernels, name, n, k, m, device, dtype)
            for name, n, k in shapes for m in rows_list]
    print(format_rows(rows))
    return 0 if all(r['ok'] for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
