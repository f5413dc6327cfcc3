"""Decoder building blocks shared by the verifier and the EAGLE draft head: RMSNorm, the
attention and gated-MLP blocks, the pre-norm decoder layer, and ``LayerKernels``, the fused
kernels a runner passes to every forward (RoPE and attention: models/rope.py,
models/attention.py). Conventions follow Hugging Face Llama so logits match
``transformers.LlamaForCausalLM`` on the same weights; Gemma's variants are options of the
same blocks (``LlamaConfig``: RMSNorm by ``1 + w``, GeGLU with tanh GELU), matching
``transformers.GemmaModel``.

Inside a layer, sub-modules are called through ``forward`` and projections through
``F.linear`` on their weights: the same operations as ``module(x)`` without
``nn.Module.__call__`` (hook dispatch), which costs more than half of a small matrix product
on a CPU, where the engine's forwards on small models are bound by per-operation overhead (a
draft forward on the embedded model: about a tenth less time). Hooks on a layer's sub-modules
therefore do not run, nor do the verifier's layers' own hooks (``forward_hidden`` calls each
layer's ``forward_deferred``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LlamaConfig
from .attention import StepBatch, attend_packed, attend_segments, write_kv_and_rope
from .fp8 import Fp8Linear, FusedFp8Linears, QuantizedRows, UnscaledProduct, scaled


@dataclass(frozen=True)
class LayerKernels:
    """The fused kernels one forward uses; each None means plain torch (the reference).

    Chosen by the runner that owns the choice and passed per forward, never stored on a
    module: runners sharing one model cannot change each other's arithmetic.
    rope_kv_write: ``kernels/rope_kv_write`` contract (rotated q back, k/v in the cache);
    rms_norm: ``kernels/rms_norm.rms_norm_ref`` contract (with or without the residual add);
    segment_attention: ``kernels/segment_attention.segment_attention_ref`` contract, the
    segments of ``attend_segments`` read straight from the KV buffer (no gathered copies);
    silu_mul: ``kernels/silu_mul.silu_mul_ref`` contract, the MLP's ``silu(gate) * up``;
    rms_norm_quant, silu_mul_quant: ``kernels/fp8_producers`` contracts, the norm or the
    activation written as e4m3 codes for FP8 projections (used only where every consumer of
    that activation is an ``Fp8Linear``);
    fp8_scales_in_consumers: the FP8 products after which a fused kernel follows (o_proj and
    down: the residual add of the next norm; gate/up: the activation) come unscaled
    (``UnscaledProduct``, tensor-wise route only) and that kernel applies their scales.
    """

    rope_kv_write: Callable | None = None
    rms_norm: Callable | None = None
    segment_attention: Callable | None = None
    silu_mul: Callable | None = None
    rms_norm_quant: Callable | None = None
    silu_mul_quant: Callable | None = None
    fp8_scales_in_consumers: bool = False


PLAIN = LayerKernels()


class RMSNorm(nn.Module):
    """Llama's RMSNorm (``w * x / rms(x)``), or Gemma's with ``unit_offset``
    (``(1 + w) * x / rms(x)``, the weight stored as the offset from one, computed in float32
    or wider and cast back last, as ``transformers.GemmaRMSNorm``; its float32 cast is not
    applied to float64 inputs, which stay float64). ``kernel`` (None = plain torch): a fused
    implementation with the contract of ``kernels/rms_norm.rms_norm_ref``, passed per call by
    the runner that owns the choice (never stored on the module, so runners sharing a model
    cannot change each other's arithmetic); used for inference only (it has no backward):
    plain torch whenever gradients are enabled. Gemma's norm takes no kernel (Llama's
    rounding order is the kernel's contract)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))
        self.eps = eps

    def add_and_norm(self, x: torch.Tensor, delta, kernel=None, quantizer=None):
        """``(x + delta, norm(x + delta))``: the residual add and the next norm, one launch
        with the kernel; with ``quantizer`` (``rms_norm_quant`` contract) the norm comes as
        ``QuantizedRows``. ``delta``: a tensor like x, or an ``UnscaledProduct``."""
        options = {}
        if isinstance(delta, UnscaledProduct):        # ``delta`` may be an unscaled product:
            if self._fused(quantizer) or self._fused(kernel):    # the kernel scales it
                options = {'residual_scales': (delta.x_scale, delta.w_scale)}
                delta = delta.acc.view(x.shape)
            else:
                delta = delta.scaled().view(x.shape)
        if self._fused(quantizer):
            total, codes, scale = quantizer(x, self.weight, self.eps, delta, **options)
            return total, QuantizedRows(codes, scale, x.dtype)
        if self._fused(kernel):
            return kernel(x, self.weight, self.eps, delta, **options)
        x = x + delta
        return x, self.forward(x)

    def _fused(self, kernel) -> bool:
        return kernel is not None and not self.unit_offset and not torch.is_grad_enabled()

    def forward(self, x: torch.Tensor, kernel=None, quantizer=None):
        """The norm of ``x``; with ``quantizer`` (and Llama's norm, no gradients) as
        ``QuantizedRows``."""
        if self._fused(quantizer):
            return QuantizedRows(*quantizer(x, self.weight, self.eps), x.dtype)
        if self.unit_offset:
            dtype = x.dtype
            h = x.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else x
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (1.0 + self.weight.to(h.dtype))).to(dtype)
        if kernel is not None and not torch.is_grad_enabled():
            return kernel(x, self.weight, self.eps)
        # Same arithmetic as HF: normalise in float32 (or higher), then scale in input dtype.
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(dtype)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _linear(linear: nn.Linear | Fp8Linear, x: torch.Tensor | QuantizedRows,
            unscaled: bool = False):
    """``linear(x)`` without ``nn.Module.__call__`` (the same ``F.linear``; a projection
    quantised by ``weight_dtype: fp8`` runs its own forward, models/fp8.py, which also takes
    ``QuantizedRows`` and with ``unscaled`` may give an ``UnscaledProduct``)."""
    if type(linear) is Fp8Linear:
        return linear.forward(x, unscaled)
    return F.linear(x, linear.weight, linear.bias)


def _all_fp8(*linears) -> bool:
    """Whether every one of ``linears`` is an ``Fp8Linear`` (and so takes ``QuantizedRows``)."""
    return all(type(lin) is Fp8Linear for lin in linears)


class FusedLinears:
    """Several bias-free ``nn.Linear`` of one input as one matrix product (inference only).

    ``fuse`` copies the weights into one (sum of out, in) tensor and re-points each linear's
    weight at its rows (views: parameter names, ``state_dict`` and in-place updates keep
    working, and no memory is duplicated). ``__call__`` returns the per-linear outputs, or None
    when the fusion no longer holds (gradients enabled, or a weight was replaced, e.g. moved
    or re-assigned) so the caller runs the separate linears: a stale copy is never used.
    Pays on a GPU (fewer launches, wider products); on a CPU the split outputs cost as much
    as they save, so ``ModelRunner`` fuses on CUDA only.
    """

    def __init__(self, linears: list[nn.Linear]):
        self.linears = linears
        self.weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
        self.sizes = [lin.weight.shape[0] for lin in linears]
        start = 0
        for lin, size in zip(linears, self.sizes):
            lin.weight = nn.Parameter(self.weight[start:start + size],
                                      requires_grad=lin.weight.requires_grad)
            start += size

    def __call__(self, x: torch.Tensor):
        if torch.is_grad_enabled():
            return None
        start = 0
        for lin, size in zip(self.linears, self.sizes):
            if lin.weight.data_ptr() != self.weight[start:].data_ptr():
                return None
            start += size
        return F.linear(x, self.weight).split(self.sizes, dim=-1)


def fuse_projections(module: nn.Module) -> None:
    """Fuse q/k/v and gate/up projections of every Llama layer in ``module`` (inference);
    FP8 projections (models/fp8.py) fuse into one FP8 product."""
    for sub in module.modules():
        if isinstance(sub, LlamaAttention):
            linears = [sub.q_proj, sub.k_proj, sub.v_proj]
        elif isinstance(sub, SwiGLU):
            linears = [sub.gate_proj, sub.up_proj]
        else:
            continue
        fp8 = [type(lin) is Fp8Linear for lin in linears]
        sub.fused = FusedFp8Linears(linears) if all(fp8) else \
            FusedLinears(linears) if not any(fp8) else None


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.fused: FusedLinears | None = None

    def takes_codes(self) -> bool:
        """Whether its input may come as ``QuantizedRows`` (q, k and v are all FP8)."""
        return _all_fp8(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x, batch: StepBatch, rope, k_cache, v_cache,
                kernels: LayerKernels = PLAIN):
        t = x.shape[0]                                 # x: (T, H), or its QuantizedRows
        qkv = self.fused(x) if self.fused is not None else None
        q, k, v = qkv if qkv is not None else (
            _linear(self.q_proj, x), _linear(self.k_proj, x), _linear(self.v_proj, x))
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        q, k = write_kv_and_rope(q, k, v, batch, rope, k_cache, v_cache, kernels.rope_kv_write)
        if batch.attn_mask is not None:
            out = attend_packed(q, k_cache, v_cache, batch)
        else:
            out = attend_segments(q, k_cache, v_cache, batch, k, v if k is not None else None,
                                  kernel=kernels.segment_attention)
        # (Unscaled: the post-attention norm's residual add applies the scales.)
        return _linear(self.o_proj, out.reshape(t, -1), kernels.fp8_scales_in_consumers)


class SwiGLU(nn.Module):
    """The gated MLP ``down(act(gate(x)) * up(x))``: SwiGLU (``act`` silu, Llama) or GeGLU
    with the tanh-approximated GELU (``gelu_tanh``, Gemma's ``gelu_pytorch_tanh``)."""

    def __init__(self, hidden: int, intermediate: int, activation: str = 'silu'):
        super().__init__()
        self.activation = activation
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.fused: FusedLinears | None = None

    def takes_codes(self) -> bool:
        """Whether its input may come as ``QuantizedRows`` (gate and up are both FP8)."""
        return _all_fp8(self.gate_proj, self.up_proj)

    def forward(self, x, kernel=None, quantizer=None, unscaled: bool = False):
        """``kernel``: the fused ``silu(gate) * up`` (None = plain torch; SwiGLU only);
        ``quantizer``: the same written as e4m3 codes (``silu_mul_quant`` contract), used when
        ``down_proj`` is FP8. ``x`` may be ``QuantizedRows`` (``takes_codes``). ``unscaled``:
        FP8 products may come unscaled (``UnscaledProduct``): gate and up, scaled by the
        fused activation, and the output, scaled by the next norm's residual add."""
        # The fused activation, if any: it writes codes when down is FP8; either form may
        # take gate and up unscaled (``scales``).
        activation = None
        if self.activation == 'silu' and not torch.is_grad_enabled():
            if quantizer is not None and type(self.down_proj) is Fp8Linear:
                activation = 'codes'
            elif kernel is not None:
                activation = 'kernel'
        unscaled_inputs = unscaled and activation is not None
        gate_up = self.fused(x, unscaled_inputs) if isinstance(self.fused, FusedFp8Linears) \
            else self.fused(x) if self.fused is not None else None
        gate, up = gate_up if gate_up is not None else (
            _linear(self.gate_proj, x, unscaled_inputs), _linear(self.up_proj, x,
                                                                 unscaled_inputs))
        options = {}
        if isinstance(gate, UnscaledProduct) and isinstance(up, UnscaledProduct) \
                and gate.x_scale is up.x_scale:         # one product's halves
            options = {'scales': (gate.x_scale, gate.w_scale, up.w_scale)}
            gate, up = gate.acc, up.acc
        gate, up = scaled(gate), scaled(up)     # (separate products: scaled each)
        if self.activation == 'gelu_tanh':
            hidden = F.gelu(gate, approximate='tanh') * up
        elif activation == 'codes':
            hidden = QuantizedRows(*quantizer(gate, up, **options), gate.dtype)
        elif activation == 'kernel':
            hidden = kernel(gate, up, **options)
        else:
            hidden = F.silu(gate) * up
        return _linear(self.down_proj, hidden, unscaled)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm Llama block. ``has_input_norm=False`` gives EAGLE's first draft layer."""

    def __init__(self, cfg: LlamaConfig, has_input_norm: bool = True):
        super().__init__()
        offset = cfg.norm_unit_offset
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset) \
            if has_input_norm else None
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, x, batch: StepBatch, rope, k_cache, v_cache,
                kernels: LayerKernels = PLAIN) -> torch.Tensor:
        """(T, H) -> (T, H): the layer's output with its residual added."""
        x, delta = self.forward_deferred(x, None, batch, rope, k_cache, v_cache, kernels)
        return x + scaled(delta).view(x.shape)

    def forward_deferred(self, x, delta, batch: StepBatch, rope, k_cache, v_cache,
                         kernels: LayerKernels = PLAIN):
        """The layer on input ``x + delta`` (``delta`` None: on ``x``) -> ``(x', delta')``,
        the output being ``x' + delta'``: the MLP's residual add is left to the next norm,
        which fuses it (``RMSNorm.add_and_norm``; one launch with the fused norm kernel
        instead of an add and a norm). With plain torch the operations are those of
        ``forward``, bit for bit."""
        # Sub-modules through ``forward``: see the module docstring.
        # With FP8 projections the norms may write codes for them (LayerKernels).
        norm = self.input_layernorm
        to_attention = kernels.rms_norm_quant if kernels.rms_norm_quant is not None \
            and self.self_attn.takes_codes() else None
        if delta is None:
            h = norm.forward(x, kernels.rms_norm, to_attention) if norm is not None else x
        elif norm is not None:
            x, h = norm.add_and_norm(x, delta, kernels.rms_norm, to_attention)
        else:
            x = h = x + scaled(delta).view(x.shape)
        to_mlp = kernels.rms_norm_quant if kernels.rms_norm_quant is not None \
            and self.mlp.takes_codes() else None
        x, h = self.post_attention_layernorm.add_and_norm(
            x, self.self_attn.forward(h, batch, rope, k_cache, v_cache, kernels),
            kernels.rms_norm, to_mlp)
        return x, self.mlp.forward(h, kernels.silu_mul, kernels.silu_mul_quant,
                                   kernels.fp8_scales_in_consumers)
