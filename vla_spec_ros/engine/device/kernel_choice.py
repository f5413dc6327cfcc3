"""Which fused kernels a forward uses (``LayerKernels``), from the engine configuration.

``use_kernels`` ("auto": on CUDA when Triton imports; "on": forced, which on a CPU needs
``TRITON_INTERPRET=1``, what the tests use to run the kernel paths against the references;
"off": plain torch) switches the fused RoPE + KV write, the fused (residual add +) RMSNorm
and the fused ``silu(gate) * up``; with ``weight_dtype: fp8`` also their forms that write
e4m3 codes for the FP8 projections (kernels/fp8_producers.py: the codes the products would
make of their inputs, one launch and one round trip fewer per product), and the kernels after
the o, down and gate/up products applying those products' scales (one scaling launch fewer
each; models/fp8.py ``QUANTIZE_IN_PRODUCERS`` and ``SCALES_IN_CONSUMERS`` turn them off for
a comparison). ``attention_backend`` "ring" adds
the segment attention kernel, which reads each segment's KV slots in place instead of
gathering them; it needs Triton on CUDA or the interpreter whatever ``use_kernels`` says, and
is never chosen by "auto" (not measured yet).
"""
from __future__ import annotations

from dataclasses import replace

from ...config import EngineConfig
from ...models.layers import PLAIN, LayerKernels


def kernels_enabled(config: EngineConfig, device) -> bool:
    """Whether the fused RoPE, norm and SwiGLU-activation kernels run (``use_kernels``, see
    the module doc)."""
    from ...kernels import can_launch_on
    if config.use_kernels == 'off':
        return False
    if config.use_kernels == 'auto':
        return getattr(device, 'type', str(device)) == 'cuda' and can_launch_on(device)
    if not can_launch_on(device):
        raise ValueError(f'use_kernels: "on" needs triton on a CUDA device (or '
                         f'TRITON_INTERPRET=1); the engine runs on {device}')
    return True


def select_layer_kernels(config: EngineConfig, device) -> LayerKernels:
    """The model runner's kernels: fused RoPE + KV write, norm and SwiGLU activation (and,
    for FP8 weights, their quantising forms) when enabled, else none."""
    if not kernels_enabled(config, device):
        return PLAIN
    from ...kernels import rms_norm_triton, rope_kv_write, silu_mul_triton
    from ...kernels.fp8_producers import rms_norm_quant_triton, silu_mul_quant_triton
    from ...models import fp8

    def rope_kernel(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
        # Index checks would read indices back to the host (a sync) on every layer; the
        # engine's planner already guarantees in-range slots, unique except the scratch slot
        # that padding rows share (its content is never read by a real row).
        return rope_kv_write(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping,
                             use_triton=True, check_indices=False)
    # The norm and the activation get model-internal shapes only: the unchecked launches.
    # (Their contract covers the activation dtypes FP8 quantises from; float64 models keep
    # the products' own quantisation.)
    fp8_kernels = config.weight_dtype == 'fp8' and config.dtype != 'float64'
    quantize = fp8_kernels and fp8.QUANTIZE_IN_PRODUCERS
    return LayerKernels(rope_kv_write=rope_kernel, rms_norm=rms_norm_triton,
                        silu_mul=silu_mul_triton,
                        rms_norm_quant=rms_norm_quant_triton if quantize else None,
                        silu_mul_quant=silu_mul_quant_triton if quantize else None,
                        fp8_scales_in_consumers=fp8_kernels and fp8.SCALES_IN_CONSUMERS)


def with_attention_backend(kernels: LayerKernels, config: EngineConfig,
                           device) -> LayerKernels:
    """``kernels`` plus the segment attention kernel when ``attention_backend`` is "ring"."""
    if config.attention_backend != 'ring':
        return kernels
    from ...kernels import can_launch_on, segment_attention_triton
    if not can_launch_on(device):
        raise ValueError(f'attention_backend: "ring" needs triton on a CUDA device (or '
                         f'TRITON_INTERPRET=1); the engine runs on {device}')
    # The planner's slots are in range by construction and every row attends to at least
    # one slot (padding rows to the scratch slot): the unchecked launch, no host sync.
    return replace(kernels, segment_attention=segment_attention_triton)
