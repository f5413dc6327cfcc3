"""FP8 weights for the Llama decoder's projections (EngineConfig ``weight_dtype: fp8``).

``quantize_decoder_`` replaces, in place, every decoder layer's q/k/v/o and gate/up/down
``nn.Linear`` by an ``Fp8Linear``: e4m3 weights with one float32 scale per output channel
(``amax(|row|) / 448``), the arithmetic of ``kernels/fp8_linear.py`` (activations quantised per
token at every call). The embeddings, ``lm_head``, the vision towers, the projector and any
draft head keep the model dtype. State-dict keys stay those of the layer (``...q_proj.weight``
now e4m3, plus ``...q_proj.weight_scale``).

Each ``Fp8Linear`` decides its path once, at quantisation, from where its weights live:
``torch._scaled_mm`` when ``kernels.scaled_mm_unsupported_reason`` has no objection (CUDA,
sm_89+, bf16, dims multiples of 16), else the dequantised reference. On a CPU the reference is
the path (dequantising the weights at every call, nothing cached: for tests and fidelity, not
speed). On CUDA a projection that cannot take the device path runs the reference with a
warning naming it; a device or dtype that cannot run FP8 at all is refused by
``apply_weight_dtype`` before anything is quantised.

A model object holds one kind of weights: the runners sharing it must agree on
``weight_dtype`` (``apply_weight_dtype`` refuses a second runner that would change, or not
see, the first one's arithmetic). Benchmarks comparing the two load the weights twice.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..kernels import (FP8_DTYPE, fp8_linear_device, fp8_linear_ref,
                       fp8_linear_scaled_mm, quantize_rows, scaled_mm_unsupported_reason)
from ..kernels.fp8_linear import (fp8_codes_linear_device, fp8_codes_linear_ref,
                                  fp8_codes_tensorwise_unscaled, quantize_on_device,
                                  scale_product_on_device)
from ..kernels.fp8_linear import MIN_CAPABILITY

WEIGHT_DTYPES = ('auto', 'fp8')
ATTENTION_PROJECTIONS = ('q_proj', 'k_proj', 'v_proj', 'o_proj')
MLP_PROJECTIONS = ('gate_proj', 'up_proj', 'down_proj')
# The route of the FP8 product on a GPU for projections quantised from now on
# (kernels.fp8_linear_device): 'tensorwise' (the tensor-wise ``_scaled_mm``, scales after it),
# 'rowwise' (``_scaled_mm`` with row-wise scales) or 'gemv' (the weight-streaming decode kernel).
# One function by three routes; 'tensorwise' measured fastest on the H200
# (bench/results/h200/20261127-fp8). A module switch, not an engine option, so that
# bench/gpu_parts.py can time the routes on one machine; nothing else should change it.
PRODUCT = 'tensorwise'
# Whether the norms and the SwiGLU activation before FP8 projections write e4m3 codes
# themselves (kernels/fp8_producers.py; where the fused kernels run: engine/device/
# kernel_choice.py) instead of each product quantising its input. The same codes either way
# (that module's contract); a module switch for bench/gpu_parts.py to time both, as PRODUCT.
QUANTIZE_IN_PRODUCERS = True
# Whether, on the tensor-wise route, the residual adds after o_proj and down and the SwiGLU
# activation after gate/up apply the products' scales themselves (kernels/rms_norm.py,
# silu_mul.py, fp8_producers.py: ``UnscaledProduct``) instead of a separate scaling launch.
# The same bits either way; a module switch for bench/gpu_parts.py, as PRODUCT.
SCALES_IN_CONSUMERS = True


@dataclass(frozen=True)
class QuantizedRows:
    """Activations their producer quantised (kernels/fp8_producers.py): e4m3 ``codes``
    (T, K), float32 ``scale`` (T, 1), and ``dtype``, the activation dtype they stand for (what
    the consuming product writes). Only ``Fp8Linear`` consumes them."""

    codes: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape


@dataclass(frozen=True)
class UnscaledProduct:
    """A tensor-wise FP8 product before its scales: ``acc`` (T, N) (codes times codes,
    float32 accumulation rounded to the activation dtype), ``x_scale`` (T, 1) and ``w_scale``
    (N,) float32. ``scaled()`` applies them as kernels/fp8_epilogue.py does; a consumer that
    takes them (the fused norm's ``residual_scales``, the activation's ``scales``) applies
    them itself, to the same bits."""

    acc: torch.Tensor
    x_scale: torch.Tensor
    w_scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.acc.shape

    def scaled(self) -> torch.Tensor:
        return scale_product_on_device(self.acc, self.x_scale, self.w_scale)

    def split(self, sizes) -> list['UnscaledProduct']:
        """The products of consecutive column blocks (a fused projection's parts)."""
        return [UnscaledProduct(acc, self.x_scale, w_scale) for acc, w_scale in
                zip(self.acc.split(sizes, dim=-1), self.w_scale.split(sizes))]


def scaled(value):
    """``value`` as a tensor: an ``UnscaledProduct`` scaled, anything else as it is."""
    return value.scaled() if isinstance(value, UnscaledProduct) else value


class Fp8Linear(nn.Module):
    """A bias-free linear layer with (N, K) e4m3 ``weight`` and (N,) float32 ``weight_scale``
    buffers (inference only: there are no gradients through it)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, use_scaled_mm: bool):
        super().__init__()
        self.register_buffer('weight', weight)
        self.register_buffer('weight_scale', weight_scale)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.use_scaled_mm = use_scaled_mm
        self.product = PRODUCT
        # The tensor-wise product's unit scales, on the weights' device from the start (a
        # graph capture must not allocate it).
        self.register_buffer('unit_scale', torch.ones((), dtype=torch.float32,
                                                      device=weight.device), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation_dtype: torch.dtype) -> 'Fp8Linear':
        """``linear``'s weights quantised per output channel (a bias is refused)."""
        if linear.bias is not None:
            raise ValueError('weight_dtype: fp8 quantises bias-free projections only')
        q, scale = quantize_rows(linear.weight.detach())
        q, scale = q.contiguous(), scale.reshape(-1).contiguous()
        return cls(q, scale, scaled_mm_unsupported_reason(q, activation_dtype) is None)

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight.to(dtype) * self.weight_scale.to(dtype)[:, None]

    def forward(self, x: torch.Tensor | QuantizedRows, unscaled: bool = False):
        """The product; with ``unscaled`` an ``UnscaledProduct`` where the route is the
        tensor-wise one (its consumer applies the scales), the scaled tensor otherwise.
        ``x`` may be ``QuantizedRows``."""
        if unscaled and self.use_scaled_mm and self.product == 'tensorwise':
            return self.forward_unscaled(x)
        if isinstance(x, QuantizedRows):
            return self.forward_codes(x)
        if self.use_scaled_mm:
            return fp8_linear_device(x, self.weight, self.weight_scale, product=self.product,
                                     unit_scale=self.unit_scale)
        return fp8_linear_ref(x, self.weight, self.weight_scale)

    def forward_unscaled(self, x: torch.Tensor | QuantizedRows) -> UnscaledProduct:
        """The tensor-wise product of (T, K) rows before the scales (``use_scaled_mm``)."""
        if isinstance(x, QuantizedRows):
            codes = x.codes.reshape(-1, x.codes.shape[-1])
            x_scale, dtype = x.scale.reshape(-1, 1), x.dtype
        else:
            codes, x_scale = quantize_on_device(x.reshape(-1, x.shape[-1]))
            dtype = x.dtype
        acc = fp8_codes_tensorwise_unscaled(codes, self.weight, dtype, self.unit_scale)
        return UnscaledProduct(acc, x_scale, self.weight_scale)

    def forward_codes(self, rows: QuantizedRows) -> torch.Tensor:
        """The product of activations already quantised: what ``forward`` gives on the
        activations those codes quantise (the same route after the quantisation)."""
        codes = rows.codes.reshape(-1, rows.codes.shape[-1])
        scale = rows.scale.reshape(-1, 1)
        if self.use_scaled_mm:
            out = fp8_codes_linear_device(codes, scale, self.weight, self.weight_scale,
                                          rows.dtype, product=self.product,
                                          unit_scale=self.unit_scale)
        else:
            out = fp8_codes_linear_ref(codes, scale, self.weight, self.weight_scale, rows.dtype)
        return out.view(*rows.codes.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'{"_scaled_mm" if self.use_scaled_mm else "dequantised reference"}'
                f'{f" ({self.product})" if self.use_scaled_mm else ""}')


class FusedFp8Linears:
    """``layers.FusedLinears`` for ``Fp8Linear``: several projections of one input as one
    product (one activation quantisation, one ``_scaled_mm``). The rows of the weights and
    their scales are concatenated (per-output-channel scales make the fused product equal to
    the separate ones) and each projection's buffers re-pointed at its rows; ``__call__``
    returns None when a buffer was replaced since (the caller then runs the projections one by
    one: a stale copy is never used)."""

    def __init__(self, linears: list[Fp8Linear]):
        self.linears = linears
        self.sizes = [lin.out_features for lin in linears]
        # Concatenated as bytes: every device concatenates uint8, not every one float8.
        weight = torch.cat([lin.weight.view(torch.uint8) for lin in linears], dim=0)
        self.fused = Fp8Linear(weight.view(FP8_DTYPE),
                               torch.cat([lin.weight_scale for lin in linears], dim=0),
                               all(lin.use_scaled_mm for lin in linears))
        start = 0
        for lin, size in zip(linears, self.sizes):
            lin.weight = self.fused.weight[start:start + size]
            lin.weight_scale = self.fused.weight_scale[start:start + size]
            start += size

    def __call__(self, x: torch.Tensor | QuantizedRows, unscaled: bool = False):
        start = 0
        for lin, size in zip(self.linears, self.sizes):
            if lin.weight.data_ptr() != self.fused.weight[start:].data_ptr() \
                    or lin.weight_scale.data_ptr() != self.fused.weight_scale[start:].data_ptr():
                return None
            start += size
        out = self.fused.forward(x, unscaled)
        return out.split(self.sizes) if isinstance(out, UnscaledProduct) \
            else out.split(self.sizes, dim=-1)


def quantize_decoder_(language_model: nn.Module, activation_dtype: torch.dtype) -> list[str]:
    """Replace every decoder layer's projections by ``Fp8Linear`` in place (``language_model``:
    ``models.llama.LlamaForCausalLM``); layers already quantised are left as they are.
    Projection fusions are dropped (they held the old weights; ``fuse_projections`` makes new
    ones). Returns the names of the projections that run the reference although their weights
    are on a CUDA device (warned about)."""
    on_reference = []
    for i, layer in enumerate(language_model.model.layers):
        for block, names in ((layer.self_attn, ATTENTION_PROJECTIONS),
                             (layer.mlp, MLP_PROJECTIONS)):
            for name in names:
                linear = getattr(block, name)
                if not isinstance(linear, Fp8Linear):
                    linear = Fp8Linear.from_linear(linear, activation_dtype)
                    setattr(block, name, linear)
                    block.fused = None
                if linear.weight.device.type == 'cuda' and not linear.use_scaled_mm:
                    reason = scaled_mm_unsupported_reason(linear.weight, activation_dtype)
                    on_reference.append(f'layers.{i}.{name}: {reason}')
    if on_reference:
        warnings.warn('weight_dtype fp8: these projections run the dequantised reference, not '
                      'torch._scaled_mm: ' + '; '.join(on_reference), RuntimeWarning,
                      stacklevel=2)
    return on_reference


def is_quantized(language_model: nn.Module) -> bool:
    """Whether any decoder projection of ``language_model`` holds FP8 weights."""
    return any(isinstance(m, Fp8Linear) for m in language_model.modules())


def check_weight_dtype(weight_dtype: str, dtype: torch.dtype, device: torch.device) -> None:
    """Raise ValueError (naming ``weight_dtype``) where ``weight_dtype`` cannot run with the
    model ``dtype`` on ``device``: fp8 on CUDA needs sm_89+ (FP8 tensor cores), bfloat16
    activations (the row-wise scaled product writes bf16) and a working ``_scaled_mm``
    (probed once on a 16 x 16 product, the activation kernel included)."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f'weight_dtype: {weight_dtype!r} not in {WEIGHT_DTYPES}')
    if weight_dtype != 'fp8' or device.type != 'cuda':
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ValueError(f'weight_dtype: fp8 needs FP8 tensor cores (sm_89 or later); '
                         f'{torch.cuda.get_device_name(device)} is sm_{capability[0]}'
                         f'{capability[1]}: use "auto"')
    if dtype != torch.bfloat16:
        raise ValueError(f'weight_dtype: fp8 on CUDA needs dtype bfloat16 (torch._scaled_mm\'s '
                         f'row-wise scaled product writes bf16), got {dtype}')
    try:
        probe = torch.ones(16, 16, device=device)
        q, scale = quantize_rows(probe)
        fp8_linear_scaled_mm(probe.to(dtype), q, scale.reshape(-1))
        # The configured route compiles and runs too (at one row: a decode step).
        fp8_linear_device(probe[:1].to(dtype), q, scale.reshape(-1), product=PRODUCT,
                          unit_scale=torch.ones((), device=device))
        torch.cuda.synchronize(device)      # an asynchronous kernel fault surfaces here
    except Exception as exc:     # noqa: BLE001 - a CUDA error or the activation kernel's
        # compile error: either way fp8 cannot run here, and the user gets the reason
        raise ValueError(f'weight_dtype: fp8: the FP8 product (activation quantisation and '
                         f'torch._scaled_mm, route {PRODUCT!r}) fails on {device}: '
                         f'{type(exc).__name__}: {exc}') from exc


def apply_weight_dtype(language_model: nn.Module, weight_dtype: str, dtype: torch.dtype,
                       device: torch.device) -> None:
    """What a runner does at load: check the option, then quantise the decoder for 'fp8'
    (idempotent: a model another fp8 runner quantised is used as it is). Refuses 'auto' on a
    model that holds FP8 weights, and 'fp8' on a model a runner already serves in its own
    dtype (quantising it would change that runner's arithmetic)."""
    check_weight_dtype(weight_dtype, dtype, device)
    served = getattr(language_model, '_served_weight_dtype', None)
    if weight_dtype == 'auto' and is_quantized(language_model):
        raise ValueError('weight_dtype: "auto" on a model whose decoder holds FP8 weights '
                         '(another runner loaded it with "fp8"): load the weights again')
    if served is not None and served != weight_dtype:
        raise ValueError(f'weight_dtype: {weight_dtype!r} on a model another runner serves '
                         f'with {served!r}: one model object holds one kind of weights; load '
                         'the weights again (or copy the model) for the other')
    if weight_dtype == 'fp8':
        quantize_decoder_(language_model, dtype)
    language_model._served_weight_dtype = weight_dtype


__all__ = ['Fp8Linear', 'FusedFp8Linears', 'QuantizedRows', 'UnscaledProduct', 'scaled',
           'WEIGHT_DTYPES', 'apply_weight_dtype', 'check_weight_dtype', 'is_quantized',
           'quantize_decoder_', 'FP8_DTYPE']
