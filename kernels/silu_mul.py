"""Fused SwiGLU activation: ``silu(gate) * up`` in one launch.

Llama's MLP is ``down(silu(gate(x)) * up(x))``. With the gate and up projections fused into one
product (``models/layers.FusedLinears``) eager PyTorch still spends two launches between the
products, a SiLU that writes a (T, I) tensor and a multiply that reads it back; on a 7B decode
forward that is 64 small launches. This kernel reads gate and up (any row strides, e.g. the
two halves of the fused product's output) and writes the product once.

Rounding follows the two torch operations it replaces, so the plain path and the kernel agree
to the last bit wherever their exponentials do: SiLU is computed in float32 (float64 for
float64 inputs) and rounded to the input dtype, as ``F.silu`` rounds its output; the product
is computed in the same precision from that rounded value and rounded once more, as ``*``
does. Differences: on CUDA, Triton's fast exp and division against torch's (a few float32
ulps before the rounding to bf16, so at most one bf16 ulp).

With FP8 projections gate and up may come unscaled (``scales``): the tensor-wise FP8 product's
``acc`` halves, with the per-row scale and each half's per-column scales, applied as
kernels/fp8_epilogue.py does (rounded to the io dtype) before the activation: the epilogue's
launch and this one give the same bits, one launch fewer.

Layout as in rope_kv_write.py: ``silu_mul_ref`` (plain torch, the oracle), ``silu_mul_triton``
(the launch, no checks), ``silu_mul`` (the validating wrapper).
"""
import torch
import torch.nn.functional as F

from ._triton_util import HAS_TRITON, LazyJit, as_rows, check_can_launch, compute_dtype, tl
from .fp8_epilogue import scale_product_ref

BLOCK = 1024        # columns per program: a 7B row (11,008) is 11 programs


def silu_mul_ref(gate, up, scales=None):
    """Plain torch: ``F.silu(gate) * up``. gate, up: (..., I) of one dtype; ``scales``: None,
    or ``(x_scale (N, 1), w_scale_gate (I,), w_scale_up (I,))`` float32 of unscaled gate and
    up (N rows), applied first as ``scale_product_ref`` does."""
    if scales is not None:
        x_scale, w_gate, w_up = scales
        gate = scale_product_ref(gate.reshape(-1, gate.shape[-1]), x_scale,
                                 w_gate).view(gate.shape)
        up = scale_product_ref(up.reshape(-1, up.shape[-1]), x_scale, w_up).view(up.shape)
    return F.silu(gate) * up


if HAS_TRITON:
    from .rms_norm import unscaled_row

    def silu_mul_block(gate_ptr, up_ptr, xs_ptr, wsg_ptr, wsu_ptr, row, cols, stride_g,
                       stride_u, mask, io_ty: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
                       SCALED: tl.constexpr):
        """A block of one row's ``silu(gate) * up``, rounded to ``io_ty``: what this file's
        kernel stores and what kernels/fp8_producers.py quantises (one computation for both).
        SCALED: gate and up are the unscaled FP8 product's, scaled first as
        kernels/fp8_epilogue.py scales them (never for float64)."""
        g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0)
        u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0)
        if SCALED:
            g = unscaled_row(g, xs_ptr, wsg_ptr, row, cols, mask, io_ty)
            u = unscaled_row(u, xs_ptr, wsu_ptr, row, cols, mask, io_ty)
        g, u = g.to(COMPUTE_DTYPE), u.to(COMPUTE_DTYPE)
        # F.silu's output, rounded to the io dtype as it is in torch, then the product.
        silu = (g / (1.0 + tl.exp(-g))).to(io_ty).to(COMPUTE_DTYPE)
        return (silu * u).to(io_ty)

    SILU_MUL_HELPERS = (silu_mul_block, unscaled_row)

    def _silu_mul_body(gate_ptr, up_ptr, out_ptr, xs_ptr, wsg_ptr, wsu_ptr, stride_g, stride_u,
                       stride_o, num_cols, BLOCK_COLS: tl.constexpr,
                       COMPUTE_DTYPE: tl.constexpr, SCALED: tl.constexpr):
        # Program (row, block): BLOCK_COLS columns of one row.
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        mask = cols < num_cols
        y = silu_mul_block(gate_ptr, up_ptr, xs_ptr, wsg_ptr, wsu_ptr, row, cols, stride_g,
                           stride_u, mask, out_ptr.dtype.element_ty, COMPUTE_DTYPE, SCALED)
        tl.store(out_ptr + row * stride_o + cols, y, mask=mask)

    _silu_mul_kernel = LazyJit(_silu_mul_body, helpers=SILU_MUL_HELPERS)


def silu_mul_triton(gate, up, scales=None, *, num_warps=4):
    """Triton launch with the contract of ``silu_mul_ref``; inputs are NOT checked
    (``scales``: contiguous float32, not for float64). Returns a new contiguous tensor of
    gate's shape. No host sync: CUDA-graph capturable."""
    g2, u2 = as_rows(gate), as_rows(up)
    num_rows, num_cols = g2.shape
    out = torch.empty((num_rows, num_cols), dtype=gate.dtype, device=gate.device)
    x_scale, w_gate, w_up = scales if scales is not None else (out, out, out)
    if out.numel():
        grid = (num_rows, -(-num_cols // BLOCK))
        _silu_mul_kernel[grid](g2, u2, out, x_scale, w_gate, w_up, g2.stride(0), u2.stride(0),
                               out.stride(0), num_cols, BLOCK_COLS=BLOCK,
                               COMPUTE_DTYPE=compute_dtype(gate.dtype),
                               SCALED=scales is not None, num_warps=num_warps)
    return out.view(gate.shape)


def silu_mul(gate, up, *, use_triton=False):
    """Validated ``silu(gate) * up``; ``use_triton`` selects the kernel (CUDA tensors, or any
    under TRITON_INTERPRET=1)."""
    for name, x in (('gate', gate), ('up', up)):
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 1:
            raise ValueError(f'{name} must be a floating tensor with at least one dim')
    if up.shape != gate.shape or up.dtype != gate.dtype or up.device != gate.device:
        raise ValueError(f'up ({tuple(up.shape)}, {up.dtype}, {up.device}) must match gate '
                         f'({tuple(gate.shape)}, {gate.dtype}, {gate.device})')
    if use_triton:
        check_can_launch(gate.device)
        return silu_mul_triton(gate, up)
    return silu_mul_ref(gate, up)
