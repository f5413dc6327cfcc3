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
- ``tensorwise``: the whole ``fp8_linear_tensorwise`` (quant + tensor-wise scaled_mm + the
  scales' kernel), the engine's default route;
- ``gemv``: the whole decode path for at most 16 rows (quant + ``fp8_gemv_triton``, what
  ``fp8_linear_device`` runs for a decode step), and ``gemv_best`` with the fastest of a few
  tiles (``--sweep``; the tile is printed): whether the default tile is the right one;
- ``floor``: the FP8 weights' bytes over the copy bandwidth measured at the start (bytes read
  plus written by a large device-to-device copy), the least a product can take;

and a second table, the producers of three of the four products' inputs (the RMS norm with
its residual add before q/k/v and gate/up, the SwiGLU activation before down) at the 7B
widths, their inputs an FP8 product's unscaled output: the producer alone, the route without
fusion (the scaling launch, the producer, ``quantize_rows_triton``: three launches), and the
fused kernel of kernels/fp8_producers.py that scales its input and quantises its output (one
launch), its codes checked equal to the three launches';

each as device time per call (a CUDA graph of 20 calls replayed, so launch gaps do not count,
as in the engine's graphed steps), with the weights' streaming rate in GB/s. The FP8 product
is first checked against the product computed from its definition in float64
(``independent_product``); a variant this torch refuses is listed as failed, not fatal.

    python3 bench/fp8_products.py             # CUDA with FP8 tensor cores (sm_89+)
    python3 bench/fp8_products.py --smoke     # the script on CPU, small shapes: the reference
                                              # checked against the definition, timed
"""
from __future__ import annotations

import argparse
import importlib
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
# (block_n, block_k, num_warps, num_stages) tried by --sweep for the decode kernel.
GEMV_TILES = [(16, 256, 4, 4), (32, 256, 4, 4), (32, 512, 4, 3), (64, 256, 4, 4),
              (64, 128, 4, 5), (32, 128, 2, 6)]


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


def independent_product(x, wq, w_scale) -> torch.Tensor:
    """The FP8 product as the definition reads, in float64 and without the kernels module's
    helpers: each row of x quantised to e4m3 with the scale amax / 448, both operands
    dequantised, multiplied. What the smoke run checks the reference (and a GPU run checks
    every variant) against."""
    x64 = x.double()
    x_scale = (x64.abs().amax(dim=-1, keepdim=True) / 448.0).clamp_min(
        torch.finfo(torch.float32).tiny)
    xq = (x64 / x_scale).clamp(-448.0, 448.0).float().to(torch.float8_e4m3fn).double()
    w = wq.double() * w_scale.double()[:, None]
    return (xq * x_scale) @ w.t()


def _timed(out: dict, name: str, fn, device) -> None:
    """``out[name]`` = ms per call of ``fn``; a variant this torch or GPU refuses is reported
    in ``out['failed']`` and leaves the rest of the table standing."""
    try:
        out[name] = device_time_ms(fn, device)
    except Exception as exc:        # noqa: BLE001 - e.g. fast accumulation refused row-wise
        out.setdefault('failed', []).append(f'{name}: {type(exc).__name__}: {exc}'[:160])


def time_shape(kernels, name: str, n: int, k: int, rows: int, device, dtype,
               bandwidth=None, sweep=False) -> dict:
    """One row of the table: each variant's ms per call and the weights' GB/s."""
    gen = torch.Generator(device='cpu').manual_seed(n * 7 + k + rows)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(device=device, dtype=dtype)
    x = torch.randn(rows, k, generator=gen).to(device=device, dtype=dtype)
    wq, w_scale = kernels.quantize_rows(w)
    wq, w_scale = wq.contiguous(), w_scale.reshape(-1).contiguous()
    expected = independent_product(x, wq, w_scale)
    # Output rounding (bf16 on a GPU) and float32 accumulation, against the product's size.
    tolerance = 1e-2 * expected.abs().max().item() + 1e-3

    def matches(got) -> bool:
        return bool((got.double() - expected).abs().max().item() <= tolerance)
    out = {'product': name, 'N': n, 'K': k, 'rows': rows}
    _timed(out, 'bf16', lambda: F.linear(x, w), device)
    can_fp8 = kernels.scaled_mm_unsupported_reason(wq, dtype) is None
    if can_fp8:
        out['ok'] = matches(kernels.fp8_linear_scaled_mm(x, wq, w_scale))
        quantize = kernels.quantize_rows_triton if kernels.HAS_TRITON else kernels.quantize_rows
        xq, x_scale = quantize(x)
        _timed(out, 'quant', lambda: quantize(x), device)
        w_t, s_b = wq.t(), w_scale.view(1, -1)
        _timed(out, 'scaled_mm', lambda: torch._scaled_mm(
            xq, w_t, scale_a=x_scale, scale_b=s_b, out_dtype=dtype), device)
        _timed(out, 'fast_accum', lambda: torch._scaled_mm(
            xq, w_t, scale_a=x_scale, scale_b=s_b, out_dtype=dtype, use_fast_accum=True),
            device)
        one = torch.ones((), device=device)
        _timed(out, 'per_tensor', lambda: torch._scaled_mm(
            xq, w_t, scale_a=one, scale_b=one, out_dtype=dtype), device)
        _timed(out, 'fp8', lambda: kernels.fp8_linear_scaled_mm(x, wq, w_scale), device)
        unit = torch.ones((), device=device)
        tensorwise = lambda: kernels.fp8_linear_tensorwise(x, wq, w_scale, unit)  # noqa: E731
        out['ok'] = out['ok'] and matches(tensorwise())
        _timed(out, 'tensorwise', tensorwise, device)
        if bandwidth:
            out['floor'] = n * k / (bandwidth * 1e9) * 1e3
    else:       # the CPU smoke run: the reference stands in for the device product
        out['ok'] = matches(kernels.fp8_linear_ref(x, wq, w_scale))
        _timed(out, 'fp8', lambda: kernels.fp8_linear_ref(x, wq, w_scale), device)
    # The decode kernel: on CUDA, or on the CPU under TRITON_INTERPRET=1 (the smoke run).
    if rows <= kernels.GEMV_MAX_ROWS and kernels.can_launch_on(device):
        xq, x_scale = kernels.quantize_rows(x)
        gemv = lambda: kernels.fp8_linear_device(  # noqa: E731
            x, wq, w_scale, product='gemv', unit_scale=None)
        out['ok'] = out['ok'] and matches(gemv())
        _timed(out, 'gemv', gemv, device)
        for tile in GEMV_TILES if sweep else []:
            bn, bk, warps, stages = tile
            try:
                got = kernels.fp8_gemv_triton(xq, x_scale, wq, w_scale, dtype, block_n=bn,
                                              block_k=bk, num_warps=warps,
                                              num_stages=stages)
                if not matches(got):
                    out.setdefault('failed', []).append(f'tile {tile}: MISMATCH')
                    continue
                ms = device_time_ms(lambda: kernels.fp8_gemv_triton(
                    xq, x_scale, wq, w_scale, dtype, block_n=bn, block_k=bk,
                    num_warps=warps, num_stages=stages), device)
            except Exception as exc:     # noqa: BLE001 - a tile this GPU cannot compile
                out.setdefault('failed', []).append(f'tile {tile}: {exc}'[:120])
                continue
            if ms < out.get('gemv_kernel_best', float('inf')):
                out['gemv_kernel_best'], out['best_tile'] = ms, tile
    bf16_bytes = n * k * w.element_size()
    out['bf16_GBps'] = bf16_bytes / out['bf16'] / 1e6 if 'bf16' in out else float('nan')
    fastest = min((out[c] for c in ('fp8', 'tensorwise', 'gemv') if c in out),
                  default=float('nan'))
    out['fp8_GBps'] = n * k / fastest / 1e6
    return out


PRODUCER_WIDTHS = [('rms_norm', 4096), ('silu_mul', 11008)]


def time_producer(kernels, name: str, width: int, rows: int, device, dtype) -> dict:
    """One producer of an FP8 product's input at one row count, its own input coming from the
    previous FP8 product unscaled (``acc`` and its scales): ms per call of the producer alone
    on scaled input (``alone``); of the route without fusion (``before``: the scaling launch
    of kernels/fp8_epilogue.py, the producer, the quantisation: three launches); and of the
    fused kernel that scales its input and quantises its output (``fused``: one launch);
    ``ok`` when the fused codes and scales equal the three launches'."""
    producers = importlib.import_module(kernels.__name__ + '.fp8_producers')
    gen = torch.Generator(device='cpu').manual_seed(width + rows)
    columns = 2 * width if name == 'silu_mul' else width
    acc = (torch.randn(rows, columns, generator=gen) * 3000).to(device=device, dtype=dtype)
    x_scale = (torch.rand(rows, 1, generator=gen) * 1e-2 + 1e-3).to(device)
    w_scale = (torch.rand(columns, generator=gen) * 1e-3 + 1e-4).to(device)
    scale = kernels.scale_product_triton
    if name == 'rms_norm':
        x = torch.randn(rows, width, generator=gen).to(device=device, dtype=dtype)
        weight = (torch.rand(width, generator=gen) + 0.5).to(device=device, dtype=dtype)
        delta = scale(acc, x_scale, w_scale)
        alone = lambda: kernels.rms_norm_triton(x, weight, 1e-6, delta)  # noqa: E731
        before = lambda: kernels.quantize_rows_triton(  # noqa: E731
            kernels.rms_norm_triton(x, weight, 1e-6, scale(acc, x_scale, w_scale))[1])
        fused = lambda: producers.rms_norm_quant_triton(  # noqa: E731
            x, weight, 1e-6, acc, residual_scales=(x_scale, w_scale))[1:]
    else:
        scales = (x_scale, w_scale[:width], w_scale[width:])
        done = scale(acc, x_scale, w_scale)
        alone = lambda: kernels.silu_mul_triton(done[:, :width], done[:, width:])  # noqa: E731

        def before():
            scaled = scale(acc, x_scale, w_scale)
            return kernels.quantize_rows_triton(kernels.silu_mul_triton(scaled[:, :width],
                                                                        scaled[:, width:]))
        fused = lambda: producers.silu_mul_quant_triton(  # noqa: E731
            acc[:, :width], acc[:, width:], scales)
    (q_before, s_before), (q_fused, s_fused) = before(), fused()
    out = {'producer': name, 'K': width, 'rows': rows,
           'ok': bool(torch.equal(q_before.view(torch.uint8), q_fused.view(torch.uint8))
                      and torch.equal(s_before, s_fused))}
    for label, fn in (('alone', alone), ('before', before), ('fused', fused)):
        _timed(out, label, fn, device)
    return out


def format_producers(rows: list[dict]) -> str:
    lines = ['| producer | rows | alone us | scale + producer + quantisation (3 launches) us | '
             'fused us | fused / 3 launches | codes equal |', '|---|---|---|---|---|---|---|']
    for r in rows:
        cells = [f'{1e3 * r[c]:.1f}' if c in r else '–' for c in ('alone', 'before', 'fused')]
        ratio = r['fused'] / r['before'] if 'fused' in r and 'before' in r else float('nan')
        lines.append(f'| {r["producer"]} K={r["K"]} | {r["rows"]} | ' + ' | '.join(cells)
                     + f' | {ratio:.2f} | {"ok" if r["ok"] else "MISMATCH"} |')
    return '\n'.join(lines)


def format_rows(rows: list[dict]) -> str:
    columns = ['bf16', 'quant', 'scaled_mm', 'fast_accum', 'per_tensor', 'fp8', 'tensorwise',
               'gemv',
               'gemv_kernel_best', 'floor']
    lines = ['| product | rows | ' + ' | '.join(f'{c} us' for c in columns)
             + ' | best fp8 / bf16 | bf16 GB/s | fp8 GB/s | checked |',
             '|---|---|' + '---|' * (len(columns) + 4)]
    for r in rows:
        cells = [f'{1e3 * r[c]:.1f}' if c in r else '–' for c in columns]
        if 'best_tile' in r:
            cells[columns.index('gemv_kernel_best')] += f' {r["best_tile"]}'
        fastest = min((r[c] for c in ('fp8', 'tensorwise', 'gemv') if c in r),
                      default=float('nan'))
        ratio = fastest / r['bf16'] if 'bf16' in r else float('nan')
        lines.append(f'| {r["product"]} {r["N"]}x{r["K"]} | {r["rows"]} | ' + ' | '.join(cells)
                     + f' | {ratio:.2f} | {r["bf16_GBps"]:.0f} | '
                     f'{r["fp8_GBps"]:.0f} | {"ok" if r["ok"] else "MISMATCH"} |')
    failures = [f'{r["product"]} x{r["rows"]}: {f}' for r in rows for f in r.get('failed', [])]
    if failures:
        lines += ['', 'failed: ' + '; '.join(failures)]
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sweep', action='store_true',
                        help='also time the decode kernel at each tile of GEMV_TILES')
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
    bandwidth = None
    if device.type == 'cuda':
        from gpu_decode_floor import copy_bandwidth_GBps       # the floor part's ceiling
        bandwidth = copy_bandwidth_GBps(device)
    if bandwidth:
        print(f'copy bandwidth (read + write): {bandwidth:.0f} GB/s', flush=True)
    rows = []
    for name, n, k in shapes:
        for m in rows_list:
            rows.append(time_shape(kernels, name, n, k, m, device, dtype, bandwidth,
                                   args.sweep and m <= 8))
            # Progress on stderr: stdout holds the final table alone.
            print(format_rows(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(format_rows(rows))
    producers = []
    if kernels.can_launch_on(device):       # CUDA, or the smoke run under TRITON_INTERPRET=1
        widths = PRODUCER_WIDTHS if not args.smoke else [('rms_norm', 64), ('silu_mul', 160)]
        for name, width in widths:
            for m in rows_list:
                producers.append(time_producer(kernels, name, width, m, device, dtype))
        print()
        print(format_producers(producers))
    return 0 if all(r['ok'] for r in rows + producers) else 1


if __name__ == '__main__':
    sys.exit(main())
