"""Block-size / num_warps sweeps of the engine's Triton kernels against their torch references.

llm.c ``dev/cuda`` style: every configuration is first validated against the reference, then
timed; the table prints the time per call and the speed-up over the reference. Shapes default to
an OpenVLA-7B-like layer (32 q and kv heads, head_dim 128, bf16) over a 4096-slot KV ring:
``rope_kv_write`` with a decode-only step, a mixed pipelined step and a prefill-sized step;
``segment_attention`` against the engine's gather + SDPA path (``attend_segments``) with one
decode segment (AR), eight (pipeline) and four 50-node trees (pipeline_spec).

    python3 bench/kernels_sweep.py                    # CUDA required; on CPU prints and exits 0
    python3 bench/kernels_sweep.py --interpret-smoke  # tiny CPU run under TRITON_INTERPRET=1,
                                                      # checks the script, timings meaningless
"""
import argparse
import importlib
import os
import pathlib
import sys
import time

import torch


def load_kernels():
    """The installed package if present, else the source tree's top-level kernels/ folder."""
    try:
        return importlib.import_module('vla_spec_ros.kernels')
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        return importlib.import_module('kernels')


def cuda_time_ms(fn, num_warmup=10, num_iters=100):
    """Mean milliseconds per call, measured with CUDA events after a warm-up."""
    for _ in range(num_warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(num_iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / num_iters


def wall_time_ms(fn, num_warmup=1, num_iters=2):
    """Wall-clock fallback for the CPU interpreter smoke run."""
    for _ in range(num_warmup):
        fn()
    begin = time.perf_counter()
    for _ in range(num_iters):
        fn()
    return (time.perf_counter() - begin) * 1e3 / num_iters


def make_rope_inputs(num_tokens, num_q_heads, num_kv_heads, head_dim, num_slots, dtype, device):
    gen = torch.Generator(device='cpu').manual_seed(0)
    max_pos = 2048
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    emb = torch.outer(torch.arange(max_pos).float(), inv_freq).repeat(1, 2)  # (max_pos, D)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    return dict(
        q=randn(num_tokens, num_q_heads, head_dim), k=randn(num_tokens, num_kv_heads, head_dim),
        v=randn(num_tokens, num_kv_heads, head_dim),
        positions=torch.randint(0, max_pos, (num_tokens,), generator=gen).to(device),
        cos_table=emb.cos().to(device=device, dtype=dtype),
        sin_table=emb.sin().to(device=device, dtype=dtype),
        k_cache=randn(num_slots, num_kv_heads, head_dim),
        v_cache=randn(num_slots, num_kv_heads, head_dim),
        # a span that wraps around the end of the ring
        slot_mapping=((num_slots - num_tokens // 2 + torch.arange(num_tokens)) % num_slots)
        .to(device))


def sweep_rope(kernels, shape, block_hs, num_warps_list, time_fn):
    inputs = make_rope_inputs(**shape)
    ref_inputs = dict(inputs, k_cache=inputs['k_cache'].clone(),
                      v_cache=inputs['v_cache'].clone())
    expected = kernels.rope_kv_write_ref(**ref_inputs)
    ref_ms = time_fn(lambda: kernels.rope_kv_write_ref(**ref_inputs))
    print(f"rope_kv_write T={shape['num_tokens']} Hq={shape['num_q_heads']} "
          f"Hkv={shape['num_kv_heads']} D={shape['head_dim']} {shape['dtype']}: "
          f"reference {ref_ms * 1e3:.1f} us")
    for block_h in block_hs:
        for num_warps in num_warps_list:
            def launch():
                return kernels.rope_kv_write_triton(**inputs, block_h=block_h,
                                                    num_warps=num_warps)
            is_ok = torch.allclose(launch().float(), expected.float(), rtol=2e-2, atol=2e-2)
            is_ok = is_ok and torch.allclose(inputs['k_cache'].float(),
                                             ref_inputs['k_cache'].float(), rtol=2e-2, atol=2e-2)
            ms = time_fn(launch)
            print(f"  block_h={block_h:3d} num_warps={num_warps}: {ms * 1e3:8.1f} us  "
                  f"x{ref_ms / ms:5.2f} vs ref  {'ok' if is_ok else 'MISMATCH'}")


def make_segment_inputs(num_segments, num_rows, num_cols, num_heads, head_dim, num_slots,
                        dtype, device):
    """A segments-layout step: each segment reads ``num_cols`` distinct ring slots under a
    random mask whose first column is always allowed (every row attends somewhere)."""
    gen = torch.Generator(device='cpu').manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
    kv_index = torch.stack([torch.randperm(num_slots, generator=gen)[:num_cols]
                            for _ in range(num_segments)]).to(device)
    seg_mask = torch.rand(num_segments, num_rows, num_cols, generator=gen) < 0.8
    seg_mask[:, :, 0] = True
    return dict(q=randn(num_segments * num_rows, num_heads, head_dim),
                k_cache=randn(num_slots, num_heads, head_dim),
                v_cache=randn(num_slots, num_heads, head_dim), kv_index=kv_index,
                seg_mask=seg_mask.to(device))


def gather_sdpa(q, k_cache, v_cache, kv_index, seg_mask):
    """The engine's own path without the kernel: ``models/attention.attend_segments`` on a
    step of segments only (each segment's K/V gathered, one batched masked SDPA call)."""
    from vla_spec_ros.models.attention import StepBatch, attend_segments
    unused = kv_index.new_zeros(0)          # positions / slots: read by the KV write only
    return attend_segments(q, k_cache, v_cache, StepBatch(
        positions=unused, slot_mapping=unused, kv_index=kv_index, seg_mask=seg_mask))


def sweep_segment_attention(kernels, shape, block_ms, block_ns, num_warps_list, time_fn):
    inputs = make_segment_inputs(**shape)
    expected = kernels.segment_attention_ref(**inputs)
    base_ms = time_fn(lambda: gather_sdpa(**inputs))
    is_base_ok = torch.allclose(gather_sdpa(**inputs).float(), expected.float(), rtol=2e-2,
                                atol=2e-2)
    print(f"segment_attention S={shape['num_segments']} Q={shape['num_rows']} "
          f"K={shape['num_cols']} H={shape['num_heads']} D={shape['head_dim']} "
          f"{shape['dtype']}: gather + SDPA {base_ms * 1e3:.1f} us "
          f"{'ok' if is_base_ok else 'MISMATCH'}")
    for block_m in block_ms:
        for block_n in block_ns:
            for num_warps in num_warps_list:
                def launch():
                    return kernels.segment_attention_triton(
                        **inputs, block_m=block_m, block_n=block_n, num_warps=num_warps)
                try:
                    is_ok = torch.allclose(launch().float(), expected.float(), rtol=2e-2,
                                           atol=2e-2)
                    ms = time_fn(launch)
                except Exception as exc:        # e.g. out of shared memory at this tile
                    print(f"  block_m={block_m:3d} block_n={block_n:3d} "
                          f"num_warps={num_warps}: failed ({type(exc).__name__})")
                    continue
                print(f"  block_m={block_m:3d} block_n={block_n:3d} num_warps={num_warps}: "
                      f"{ms * 1e3:8.1f} us  x{base_ms / ms:5.2f} vs gather + SDPA  "
                      f"{'ok' if is_ok else 'MISMATCH'}")


SEGMENT_SHAPES = [(1, 1, 300), (8, 1, 300), (4, 50, 350)]   # AR, pipeline, pipeline_spec


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--interpret-smoke', action='store_true',
                        help='tiny CPU run under TRITON_INTERPRET=1 (checks the script only)')
    parser.add_argument('--num-tokens', type=int, nargs='+', default=[8, 64, 300],
                        help='tokens per packed step (decode-only, mixed, prefill-sized)')
    args = parser.parse_args(argv)
    if args.interpret_smoke:
        os.environ['TRITON_INTERPRET'] = '1'
        kernels = load_kernels()
        if not kernels.HAS_TRITON:
            print('triton is not importable; nothing to sweep')
            return 0
        shape = dict(num_tokens=4, num_q_heads=4, num_kv_heads=2, head_dim=16, num_slots=32,
                     dtype=torch.float32, device='cpu')
        sweep_rope(kernels, shape, [1, 2], [4], wall_time_ms)
        sweep_segment_attention(kernels, dict(num_segments=2, num_rows=3, num_cols=20,
                                              num_heads=2, head_dim=16, num_slots=64,
                                              dtype=torch.float32, device='cpu'),
                                [16], [16], [4], wall_time_ms)
        return 0
    if not torch.cuda.is_available():
        print('kernels_sweep: CUDA is required for timings; nothing to do on CPU '
              '(use --interpret-smoke to check the script)')
        return 0
    kernels = load_kernels()
    if not kernels.HAS_TRITON:
        print('kernels_sweep: triton is not importable; nothing to sweep')
        return 0
    print(f'device: {torch.cuda.get_device_name()}  torch {torch.__version__}')
    for num_tokens in args.num_tokens:
        shape = dict(num_tokens=num_tokens, num_q_heads=32, num_kv_heads=32, head_dim=128,
                     num_slots=4096, dtype=torch.bfloat16, device='cuda')
        sweep_rope(kernels, shape, [1, 2, 4, 8, 16], [1, 2, 4, 8], cuda_time_ms)
    for num_segments, num_rows, num_cols in SEGMENT_SHAPES:
        shape = dict(num_segments=num_segments, num_rows=num_rows, num_cols=num_cols,
                     num_heads=32, head_dim=128, num_slots=4096, dtype=torch.bfloat16,
                     device='cuda')
        sweep_segment_attention(kernels, shape, [16, 32, 64], [16, 32, 64], [2, 4, 8],
                                cuda_time_ms)
    return 0


if __name__ == '__main__':
    sys.exit(main())
