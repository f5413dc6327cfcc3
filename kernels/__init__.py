"""Fused kernels of the engine, each beside its plain-torch reference (llm.c ``dev/cuda`` style).

``rope_kv_write``: RoPE at logical positions + K/V store into ring slots (ActionFlow's fused
write). ``kv_copy``: overlap-safe slot copy for ring shift / slot remap / accepted-path
compaction, with the ``ring_shift_slots`` index planner. Each has ``*_ref`` (oracle),
``*_triton`` (unchecked launch) and a validating wrapper taking ``use_triton``.
Installed as ``vla_spec_ros.kernels``; imports inside this folder stay relative so the source
tree's top-level ``kernels`` package works too.
"""
from ._triton_util import HAS_TRITON, is_interpret_mode, is_triton_available
from .kv_copy import kv_copy, kv_copy_ref, kv_copy_triton, ring_shift_slots
from .rope_kv_write import rope_kv_write, rope_kv_write_ref, rope_kv_write_triton

__all__ = [
    'HAS_TRITON', 'is_interpret_mode', 'is_triton_available',
    'kv_copy', 'kv_copy_ref', 'kv_copy_triton', 'ring_shift_slots',
    'rope_kv_write', 'rope_kv_write_ref', 'rope_kv_write_triton',
]
