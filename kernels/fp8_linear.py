"""FP8 linear layer: e4m3 weights with one scale per output channel, activations quantised per
token, the product through ``torch._scaled_mm`` on GPUs with FP8 tensor cores.

Quantisation (``quantize_rows``, in kernels/fp8_quant.py beside its one-launch Triton kernel):
each row of a tensor gets the scale ``amax(|row|) / 448`` (448 is e4m3's largest finite value)
in float32, and the row divided by it, clamped to [-448, 448] and rounded to
``torch.float8_e4m3fn``. Weights (N, K) are quantised once at load, one scale per output
channel; activations (T, K) are quantised at every call, one scale per token. Per token, not
per tensor: a row's quantisation depends on that row alone, so a token's output is the same
whatever else shares the packed step (speculative verification and the pipeline batch rows
differently from AR, and still give AR's tokens).

The product of a row ``x`` and an output channel ``w`` is ``sum(xq * wq) * sx * sw``:
- ``fp8_linear_ref`` (plain torch, the oracle, any device): dequantises both operands
  (``q.to(compute dtype) * scale``) and multiplies them with ``F.linear`` in float32 (float64
  for float64 inputs), rounding the result to the input dtype once. The weights are dequantised
  on every call (nothing is cached: the weights stay one byte per element); it exists for tests,
  CPU runs and fidelity measurements, not for speed.
- ``fp8_linear_scaled_mm`` (the launch, no checks): the activations quantised by the Triton
  kernel on CUDA (``quantize_rows`` elsewhere), then ``torch._scaled_mm`` with row-wise scales,
  fp8 products accumulated in float32 by the tensor cores, scaled, rounded to bf16.
- ``fp8_linear`` (the validating wrapper) with ``use_scaled_mm`` choosing between them.
- ``fp8_linear_tensorwise``: the codes through the tensor-wise ``_scaled_mm`` (unit scales),
  the scales applied after it (kernels/fp8_epilogue.py): the fastest on the H200.
- ``fp8_linear_device`` (the engine's launch): one of ``PRODUCTS`` (tensorwise, rowwise, or
  the weight-streaming kernel of kernels/fp8_gemv.py for decode steps). All compute the same
  per-token W8A8 function; they differ in the order of float32 additions and, tensor-wise, one
  intermediate rounding.

``_scaled_mm`` constraints (torch 2.13, ``_meta_registrations._check_scaled_mm_sizes`` and
the CUDA dispatch): both operands e4m3; the first (T, K) row-major, the second (K, N)
column-major (a row-major (N, K) weight transposed is one); K and N multiples of 16 on CUDA (T
is free); row-wise scales float32, ``scale_a`` (T, 1) and ``scale_b`` (1, N), contiguous; on
sm_89, or sm_90 with a cuBLAS older than 12.9, the row-wise kernel writes bf16 (newer builds
also fp16) only, hence bf16 activations on CUDA (``scaled_mm_unsupported_reason``).
"""
import torch
import torch.nn.functional as F

from ._triton_util import HAS_TRITON
# The quantisation (reference and kernel) lives in fp8_quant.py; its names stay importable here.
from .fp8_quant import FP8_DTYPE, FP8_MAX, quantize_rows, quantize_rows_triton  # noqa: F401
from .fp8_gemv import MAX_ROWS as GEMV_MAX_ROWS
from .fp8_gemv import fp8_gemv_triton
from .fp8_epilogue import scale_product_ref, scale_product_triton

MIN_CAPABILITY = (8, 9)              # FP8 tensor cores: Ada (sm_89), Hopper (sm_90) and later


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale`` in ``dtype``; ``scale`` broadcasts over the last dim ((..., 1) or (N, 1))."""
    return q.to(dtype) * scale.to(dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def fp8_codes_linear_ref(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                         weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Plain torch, for activations already quantised (by their producer,
    kernels/fp8_producers.py): xq (..., K) e4m3, x_scale (..., 1) float32 -> (..., N) in
    ``dtype``: both operands dequantised, then ``F.linear`` in float32 (float64 for float64)."""
    compute = _compute_dtype(dtype)
    w = dequantize_rows(weight, weight_scale[:, None], compute)
    return F.linear(dequantize_rows(xq, x_scale, compute), w).to(dtype)


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor):
    """Plain torch: x (..., K) floating, weight (N, K) e4m3, weight_scale (N,) float32 ->
    (..., N) in x's dtype: x quantised per token, both operands dequantised, then ``F.linear``
    in float32 (float64 for float64 x)."""
    xq, x_scale = quantize_rows(x)
    return fp8_codes_linear_ref(xq, x_scale, weight, weight_scale, x.dtype)


def quantize_on_device(x2: torch.Tensor):
    """Per-token codes and scales of (T, K) activations: the Triton kernel on CUDA (one launch,
    the bytes of ``quantize_rows`` on CUDA: kernels/fp8_quant.py), ``quantize_rows`` elsewhere."""
    if HAS_TRITON and x2.device.type == 'cuda':
        return quantize_rows_triton(x2)
    return quantize_rows(x2)


def fp8_codes_scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                        weight_scale: torch.Tensor, dtype: torch.dtype, *,
                        use_fast_accum: bool = False) -> torch.Tensor:
    """The row-wise ``torch._scaled_mm`` of codes (T, K) and their scales (T, 1) (inputs NOT
    checked) -> (T, N) in ``dtype``."""
    return torch._scaled_mm(xq.contiguous(), weight.t(), scale_a=x_scale,
                            scale_b=weight_scale.view(1, -1), out_dtype=dtype,
                            use_fast_accum=use_fast_accum)


def fp8_linear_scaled_mm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         *, use_fast_accum: bool = False):
    """``torch._scaled_mm`` with the contract of ``fp8_linear_ref``; inputs are NOT checked
    (``fp8_linear`` checks them). x (..., K), weight (N, K) row-major e4m3, weight_scale (N,)
    float32 contiguous. No host sync: CUDA-graph capturable.

    On CUDA (with Triton) the activations are quantised by ``quantize_rows_triton``, one launch
    instead of the reference's eight or so, whose contract is the bytes and scales of
    ``quantize_rows`` on CUDA (kernels/fp8_quant.py); elsewhere (the CPU's ``_scaled_mm``) by
    ``quantize_rows`` itself."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_on_device(x2)
    out = fp8_codes_scaled_mm(xq, x_scale, weight, weight_scale, x.dtype,
                              use_fast_accum=use_fast_accum)
    return out.view(*x.shape[:-1], weight.shape[0])


def fp8_codes_tensorwise(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                         weight_scale: torch.Tensor, dtype: torch.dtype,
                         unit_scale: torch.Tensor) -> torch.Tensor:
    """The tensor-wise ``torch._scaled_mm`` of codes (T, K) with unit scales, then the scales
    (kernels/fp8_epilogue.py; its reference off CUDA) -> (T, N) in ``dtype`` (inputs NOT
    checked)."""
    acc = fp8_codes_tensorwise_unscaled(xq, weight, dtype, unit_scale)
    return scale_product_on_device(acc, x_scale, weight_scale)


def fp8_codes_tensorwise_unscaled(xq: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype,
                                  unit_scale: torch.Tensor) -> torch.Tensor:
    """The tensor-wise ``torch._scaled_mm`` of codes (T, K) and the weight's codes with unit
    scales -> ``acc`` (T, N) in ``dtype``, before any scale (inputs NOT checked): what a
    consumer that applies the scales itself takes (kernels/rms_norm.py, silu_mul.py)."""
    return torch._scaled_mm(xq.contiguous(), weight.t(), scale_a=unit_scale, scale_b=unit_scale,
                            out_dtype=dtype)


def scale_product_on_device(acc: torch.Tensor, x_scale: torch.Tensor,
                            w_scale: torch.Tensor) -> torch.Tensor:
    """kernels/fp8_epilogue.py's scaling of ``acc``: its kernel on CUDA, its reference
    elsewhere."""
    scale = scale_product_triton if HAS_TRITON and acc.device.type == 'cuda' \
        else scale_product_ref
    return scale(acc, x_scale, w_scale)


def fp8_linear_tensorwise(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                          unit_scale: torch.Tensor) -> torch.Tensor:
    """The same function through the tensor-wise ``torch._scaled_mm`` (inputs NOT checked):
    the codes multiplied with unit scales (``unit_scale``: a float32 scalar 1 on the weight's
    device, kept by the caller so that no graph capture allocates it), then the per-token and
    per-channel scales applied by kernels/fp8_epilogue.py (its reference off CUDA). Faster than
    the row-wise product on the H200 (that module's docstring); one more rounding of the
    output dtype. No host sync: CUDA-graph capturable."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_on_device(x2)
    out = fp8_codes_tensorwise(xq, x_scale, weight, weight_scale, x.dtype, unit_scale)
    return out.view(*x.shape[:-1], weight.shape[0])


PRODUCTS = ('tensorwise', 'rowwise', 'gemv')


def fp8_codes_linear_device(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                            weight_scale: torch.Tensor, dtype: torch.dtype, *, product: str,
                            unit_scale: torch.Tensor) -> torch.Tensor:
    """``fp8_linear_device`` for activations already quantised (codes (T, K), scales (T, 1);
    inputs NOT checked) -> (T, N) in ``dtype``: the same routes after the quantisation."""
    if product == 'tensorwise':
        return fp8_codes_tensorwise(xq, x_scale, weight, weight_scale, dtype, unit_scale)
    if product == 'gemv' and HAS_TRITON and xq.shape[0] <= GEMV_MAX_ROWS:
        return fp8_gemv_triton(xq, x_scale, weight, weight_scale, dtype)
    return fp8_codes_scaled_mm(xq, x_scale, weight, weight_scale, dtype)


def fp8_linear_device(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
                      product: str, unit_scale: torch.Tensor) -> torch.Tensor:
    """The engine's FP8 product on a GPU (inputs NOT checked, as ``fp8_linear_scaled_mm``'s),
    one function by three routes: ``tensorwise`` (``fp8_linear_tensorwise``), ``rowwise``
    (``fp8_linear_scaled_mm``), ``gemv`` (at most ``GEMV_MAX_ROWS`` rows through
    ``fp8_gemv_triton``, more rows row-wise). The row count is a Python int, fixed per
    captured step, so the choice is CUDA-graph safe."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_on_device(x2)
    out = fp8_codes_linear_device(xq, x_scale, weight, weight_scale, x.dtype, product=product,
                                  unit_scale=unit_scale)
    return out.view(*x.shape[:-1], weight.shape[0])


def scaled_mm_unsupported_reason(weight: torch.Tensor, dtype: torch.dtype):
    """Why ``fp8_linear_scaled_mm`` cannot run a (N, K) e4m3 ``weight`` with ``dtype``
    activations on the weight's device, or None when it can."""
    if weight.device.type != 'cuda':
        return f'the weights are on {weight.device}, not a CUDA device'
    capability = torch.cuda.get_device_capability(weight.device)
    if capability < MIN_CAPABILITY:
        return (f'{torch.cuda.get_device_name(weight.device)} is sm_{capability[0]}'
                f'{capability[1]}: FP8 tensor cores need sm_89 or later')
    if dtype != torch.bfloat16:
        return f'the row-wise scaled product writes bfloat16 on CUDA, activations are {dtype}'
    n, k = weight.shape
    if n % 16 or k % 16:
        return f'weight ({n}, {k}): both dims must be multiples of 16'
    if weight.stride() != (k, 1):
        return f'weight ({n}, {k}) is not row-major (strides {weight.stride()})'
    return None


def check_fp8_weight(weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
    """Raise ValueError unless weight is (N, K) e4m3 and weight_scale (N,) float32 beside it."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != FP8_DTYPE or weight.dim() != 2:
        raise ValueError(f'weight must be a 2-dim {FP8_DTYPE} tensor, got '
                         f'{getattr(weight, "dtype", type(weight).__name__)} '
                         f'{tuple(getattr(weight, "shape", ()))}')
    if (not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != torch.float32
            or tuple(weight_scale.shape) != (weight.shape[0],)
            or weight_scale.device != weight.device):
        raise ValueError(f'weight_scale must be float32 ({weight.shape[0]},) on '
                         f'{weight.device}, got {getattr(weight_scale, "dtype", None)} '
                         f'{tuple(getattr(weight_scale, "shape", ()))}')


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
               use_scaled_mm: bool = False) -> torch.Tensor:
    """Validated FP8 linear; ``use_scaled_mm`` selects ``torch._scaled_mm`` (CUDA, sm_89+,
    bf16 activations, dims multiples of 16), else the dequantised reference. A request the
    device path cannot serve raises ValueError naming why (never a silent fallback)."""
    check_fp8_weight(weight, weight_scale)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 1 \
            or x.dtype == FP8_DTYPE:
        raise ValueError('x must be a floating tensor with at least one dim')
    if x.shape[-1] != weight.shape[1] or x.device != weight.device:
        raise ValueError(f'x (..., {x.shape[-1]}) on {x.device} does not match weight '
                         f'{tuple(weight.shape)} on {weight.device}')
    if use_scaled_mm:
        reason = scaled_mm_unsupported_reason(weight, x.dtype)
        if reason is not None:
            raise ValueError(f'use_scaled_mm=True: {reason}')
        return fp8_linear_scaled_mm(x.contiguous(), weight, weight_scale)
    return fp8_linear_ref(x, weight, weight_scale)
