"""Fused kernels of the engine, each beside its plain-torch reference (llm.c ``dev/cuda`` style).

``rope_kv_write``: RoPE at logical positions + K/V store into ring slots (ActionFlow's fused
write), with ``rope_kv_write_ref`` (oracle), ``rope_kv_write_triton`` (unchecked launch) and a
validating wrapper taking ``use_triton``.
``rms_norm``: Llama's RMSNorm, optionally with the residual add before it, in one launch per
norm (``rms_norm_ref``, ``rms_norm_triton``, ``rms_norm``).
``silu_mul``: the SwiGLU activation ``silu(gate) * up`` in one launch (``silu_mul_ref``,
``silu_mul_triton``, ``silu_mul``).
``fp8_linear``: a linear layer with e4m3 weights (one scale per output channel) and activations
quantised per token, through ``torch._scaled_mm`` on FP8 tensor cores (``fp8_linear_ref``, the
dequantised product, ``fp8_linear_scaled_mm``, ``fp8_linear``).
``fp8_gemv``: the same FP8 product for a few rows (a decode step), one pass over the weight
bytes (``fp8_gemv_ref``, ``fp8_gemv_triton``, ``fp8_gemv``); ``fp8_linear_device`` picks it or
``_scaled_mm`` by row count; ``fp8_epilogue``: the per-token and per-channel scales after the
tensor-wise ``_scaled_mm`` (``fp8_linear_tensorwise``), in one launch.
``fp8_quant``: the per-token e4m3 quantisation of the activations in one launch, byte for byte
as ``quantize_rows`` (``quantize_rows``, ``quantize_rows_triton``, ``fp8_quant``).
``fp8_producers``: the RMS norm and the SwiGLU activation writing e4m3 codes for the FP8
products in the launch that produces them, byte for byte as the producer's kernel followed by
``quantize_rows_triton`` (``rms_norm_quant_ref`` / ``_triton`` / ``rms_norm_quant``, the same
for ``silu_mul_quant``).
``segment_attention``: each segment's queries over its own KV slots, read in place from the
slot-addressed cache (no gathered K/V copies), under the segment's mask
(``segment_attention_ref``, ``segment_attention_triton``, ``segment_attention``).
(The accepted-path KV compaction is a plain torch gather-then-scatter inside the layer,
``models/attention.write_kv_and_rope``.)
Installed as ``vla_spec_ros.kernels``; imports inside this folder stay relative so the source
tree's top-level ``kernels`` package works too.
"""
from ._triton_util import HAS_TRITON, can_launch_on, is_interpret_mode, is_triton_available
from .fp8_gemv import MAX_ROWS as GEMV_MAX_ROWS
from .fp8_gemv import fp8_gemv, fp8_gemv_ref, fp8_gemv_triton
from .fp8_epilogue import scale_product, scale_product_ref, scale_product_triton
from .fp8_linear import (FP8_DTYPE, PRODUCTS, dequantize_rows, fp8_linear, fp8_linear_device,
                         fp8_linear_ref, fp8_linear_scaled_mm, fp8_linear_tensorwise,
                         quantize_rows, scaled_mm_unsupported_reason)
from .fp8_quant import fp8_quant, quantize_rows_triton
from .fp8_producers import (rms_norm_quant, rms_norm_quant_ref, rms_norm_quant_triton,
                            silu_mul_quant, silu_mul_quant_ref, silu_mul_quant_triton)
from .rms_norm import rms_norm, rms_norm_ref, rms_norm_triton
from .rope_kv_write import rope_kv_write, rope_kv_write_ref, rope_kv_write_triton
from .segment_attention import (segment_attention, segment_attention_ref,
                                segment_attention_triton)
from .silu_mul import silu_mul, silu_mul_ref, silu_mul_triton

__all__ = [
    'HAS_TRITON', 'can_launch_on', 'is_interpret_mode', 'is_triton_available',
    'FP8_DTYPE', 'dequantize_rows', 'fp8_linear', 'fp8_linear_ref', 'fp8_linear_scaled_mm',
    'fp8_linear_device', 'fp8_linear_tensorwise', 'PRODUCTS', 'GEMV_MAX_ROWS', 'fp8_gemv',
    'scale_product', 'scale_product_ref', 'scale_product_triton', 'fp8_gemv_ref',
    'fp8_gemv_triton',
    'quantize_rows', 'scaled_mm_unsupported_reason', 'fp8_quant', 'quantize_rows_triton',
    'rms_norm_quant', 'rms_norm_quant_ref', 'rms_norm_quant_triton', 'silu_mul_quant',
    'silu_mul_quant_ref', 'silu_mul_quant_triton',
    'rms_norm', 'rms_norm_ref', 'rms_norm_triton',
    'rope_kv_write', 'rope_kv_write_ref', 'rope_kv_write_triton',
    'segment_attention', 'segment_attention_ref', 'segment_attention_triton',
    'silu_mul', 'silu_mul_ref', 'silu_mul_triton',
]
