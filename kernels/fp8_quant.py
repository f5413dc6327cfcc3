"""Per-token FP8 (e4m3) quantisation of activations in one launch.

``fp8_linear_scaled_mm`` quantises its activations (T, K) at every call: each row gets the scale
``max(amax(|row|) / 448, float32 tiny)`` and becomes ``clamp(row / scale, -448, 448)`` rounded to
``torch.float8_e4m3fn``. In eager PyTorch (``quantize_rows``, the reference) that is a cast to
float32, an abs, an amax, a division, a clamp_min, a division, a clamp and a cast to e4m3: about
eight launches and float32 temporaries per product, four products per decoder layer. The kernel
reads each row once for its amax and once more to quantise it (the second read is expected to
hit the cache: a row is at most 11,008 elements), writing the e4m3 row and its scale; the
speed-up on a GPU is expected, not measured yet.

Bit-exact contract: for finite inputs, ``quantize_rows_triton(x)`` equals ``quantize_rows(x)``
computed on x's device, byte for byte in ``q`` and bit for bit in ``scale``:

- The scale. torch divides a tensor by a Python scalar differently per device: the CPU divides
  (``amax / 448`` correctly rounded), CUDA multiplies by the float32 reciprocal
  (``aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu``: a CPU-scalar divisor becomes
  ``a * (1 / b)``), which differs from the division in the last bit for about half of all
  amax values. ``scale_by_reciprocal`` picks the CUDA form for CUDA tensors and the division
  otherwise, so the kernel follows the reference of the device it runs on.
- The row divided by the scale: an IEEE division (``tl.math.div_rn``), as torch's tensor by
  tensor division is; Triton's plain ``/`` on float32 compiles to the approximate
  ``div.full.f32`` on NVIDIA GPUs, and a multiplication by ``1 / scale`` gives another float32
  quotient for about a quarter of random elements.
- The rounding to e4m3: done in the kernel with integer and float32 operations that reproduce
  c10's ``fp8e4m3fn_from_fp32_value`` (round to nearest even, subnormals on the 2^-9 grid, the
  sign kept on zeros), and stored as bytes. Triton's own fp32 -> fp8 conversion is not used: in
  the CPU interpreter it rounds ties away from zero and truncates subnormals, and on the GPU it
  needs sm_89+ (the kernel itself runs on any CUDA GPU).
- bf16 inputs are read as their 16 bits and widened to float32 by a shift (exact, as the GPU's
  conversion is): the interpreter's bf16 -> float32 conversion gets bf16 subnormals wrong.

Checked: the tests compare bytes and scales under the interpreter (every e4m3 tie and its
neighbours included); the GPU code compiles for sm_90 (Triton 3.6 and 3.9) to ``div.rn.f32``
without flush-to-zero, no spills, 16-byte loads and stores; the CUDA tests (bytes against torch
on CUDA) run where a GPU is present.

Outside the contract: infinities and NaNs give a row whose scale is inf or NaN, as in the
reference (so the product is not finite either), and NaN codes where the reference has them,
without promising the NaN's sign bit (which torch takes from the platform's NaN propagation).

Layout as in silu_mul.py: ``quantize_rows`` (plain torch, the reference, any dtype and device;
also what the CPU path and the weight quantisation at load use), ``quantize_rows_triton`` (the
launch, no checks) and ``fp8_quant`` (the validating wrapper).
"""
import torch

from ._triton_util import HAS_TRITON, LazyJit, as_rows, check_can_launch, next_power_of_2, tl

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0                      # torch.finfo(torch.float8_e4m3fn).max
_TINY = torch.finfo(torch.float32).tiny
# float32(1) / float32(448), correctly rounded: the factor torch's CUDA division by the Python
# scalar 448 multiplies with (computed on the CPU, where float32 division is a true division).
_INV_FP8_MAX = torch.tensor(1.0, dtype=torch.float32).div(FP8_MAX).item()
MAX_BLOCK_K = 4096                   # columns per loop step: a 7B row is 1 (K 4096) or 3 steps
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def quantize_rows(x: torch.Tensor):
    """(..., K) floating -> ``(q, scale)``: ``q`` e4m3 of x's shape, ``scale`` float32 (..., 1)
    with ``x ~= q * scale`` row by row (an all-zero row gets the smallest normal scale and
    zeros). On CUDA torch computes ``amax / 448`` as ``amax * float32(1 / 448)``, on the CPU as
    a division: the scales of the two devices may differ in their last bit."""
    x32 = x.to(torch.float32)
    scale = (x32.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(_TINY)
    q = (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


if HAS_TRITON:
    import triton

    @triton.jit
    def _maximum(a, b):
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    # Device functions shared with the kernels that quantise what they produce
    # (kernels/fp8_producers.py): plain functions, jitted with each kernel (LazyJit's helpers).
    def load_as_float32(ptr, mask, BF16_BITS: tl.constexpr):
        """The values at ``ptr`` (lanes off ``mask`` read 0) widened to float32. BF16_BITS: they
        are bf16 values stored as int16 bits, widened by a 16-bit shift (exact, what the GPU's own
        conversion does); the CPU interpreter's bf16 -> float32 conversion gets bf16 sub-normals
        wrong."""
        raw = tl.load(ptr, mask=mask, other=0)
        if BF16_BITS:
            return (raw.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32,
                                                                            bitcast=True)
        return raw.to(tl.float32)

    def row_scale(amax, SCALE_BY_RECIPROCAL: tl.constexpr, INV_FP8_MAX: tl.constexpr,
                  FP8_MAX: tl.constexpr, TINY: tl.constexpr):
        """A row's float32 scale from its amax, as torch computes ``amax / 448`` on the device
        the kernel imitates, then ``clamp_min(tiny)`` (a NaN amax stays NaN)."""
        if SCALE_BY_RECIPROCAL:                 # torch on CUDA: amax * float32(1 / 448)
            scale = amax * INV_FP8_MAX
        else:                                   # torch on the CPU: amax / 448, IEEE division
            scale = tl.math.div_rn(amax, tl.full((), FP8_MAX, tl.float32))
        return tl.maximum(scale, TINY, propagate_nan=tl.PropagateNan.ALL)

    def e4m3_codes(x, scale_block, FP8_MAX: tl.constexpr):
        """float32 values ``x`` and their row's scale (broadcast to x's shape) -> the e4m3 codes
        of ``clamp(x / scale, -448, 448)`` as int32 (0..255), as c10 rounds float32 to e4m3."""
        v = tl.math.div_rn(x, scale_block)       # an IEEE division, as torch's
        bits = v.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80              # the e4m3 sign bit, kept on zeros like c10
        a = tl.minimum(tl.abs(v), FP8_MAX)      # |clamp(v)|; a NaN becomes 448 here, fixed below
        a_bits = a.to(tl.int32, bitcast=True)
        # |v| >= 2^-6 (e4m3 normal): re-bias the exponent (127 -> 7) and round the mantissa to 3
        # bits, to nearest even, on the integer bits (c10's normal path); a carry into the
        # exponent is the correct rounding up to the next binade. Codes <= 0x7E (448).
        odd = (a_bits >> 20) & 1
        normal = (a_bits + (((7 - 127) << 23) + 0x7FFFF) + odd) >> 20
        # |v| < 2^-6 (e4m3 subnormal, step 2^-9): adding 2^14, whose float32 ulp is 2^-9, rounds
        # |v| to that grid (float32 addition rounds to nearest even); the bits above 2^14's are
        # the code, 8 when |v| rounds up to 2^-6, which is that normal's code.
        magic = tl.full(v.shape, 16384.0, tl.float32)
        subnormal = (a + magic).to(tl.int32, bitcast=True) - magic.to(tl.int32, bitcast=True)
        code = tl.where(a_bits >= (121 << 23), normal, subnormal)
        return tl.where(v != v, 0x7F, code) | sign          # NaN -> e4m3's NaN code

    QUANT_HELPERS = (load_as_float32, row_scale, e4m3_codes)

    def _fp8_quant_body(x_ptr, q_ptr, scale_ptr, stride_x,
                        K: tl.constexpr, BLOCK_K: tl.constexpr, NUM_BLOCKS: tl.constexpr,
                        BF16_BITS: tl.constexpr, SCALE_BY_RECIPROCAL: tl.constexpr,
                        INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr, TINY: tl.constexpr):
        # One program per row; K and the block count are compile-time constants (one compilation
        # per projection width), so no loop bound is a runtime value.
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        q_row = q_ptr + row * K                 # q is contiguous (T, K) bytes
        offsets = tl.arange(0, BLOCK_K)

        # Pass 1: amax(|row|) in float32 (a NaN anywhere makes it NaN, as torch's amax does).
        # Lanes past K load 0, which leaves the maximum of absolute values unchanged.
        running = tl.full((BLOCK_K,), 0.0, tl.float32)     # (tl.zeros is a library function)
        for b in range(NUM_BLOCKS):
            cols = b * BLOCK_K + offsets
            x = load_as_float32(x_row + cols, cols < K, BF16_BITS)
            running = tl.maximum(running, tl.abs(x), propagate_nan=tl.PropagateNan.ALL)
        # tl.reduce with a combine of our own, not tl.max: library functions are jitted for the
        # interpreter mode in force when triton was imported (see rms_norm.py).
        amax = tl.reduce(running, 0, _maximum)
        scale = row_scale(amax, SCALE_BY_RECIPROCAL, INV_FP8_MAX, FP8_MAX, TINY)
        tl.store(scale_ptr + row, scale)

        # Pass 2: the codes.
        scale_block = tl.full((BLOCK_K,), 0.0, tl.float32) + scale
        for b in range(NUM_BLOCKS):
            cols = b * BLOCK_K + offsets
            mask = cols < K
            x = load_as_float32(x_row + cols, mask, BF16_BITS)
            code = e4m3_codes(x, scale_block, FP8_MAX)
            tl.store(q_row + cols, code.to(tl.uint8), mask=mask)

    _fp8_quant_kernel = LazyJit(_fp8_quant_body, helpers=QUANT_HELPERS)


def quantize_rows_triton(x: torch.Tensor, *, scale_by_reciprocal=None, block_k=None,
                         num_warps=None):
    """Triton launch with the contract of ``quantize_rows``; inputs are NOT checked (x
    floating bf16 / fp16 / float32 with K >= 1 columns; any row stride). Returns ``q``, a new
    contiguous e4m3 tensor of x's shape, and ``scale``, float32 (..., 1).
    ``scale_by_reciprocal`` (default: whether x is on a CUDA device) computes the scale as
    ``amax * float32(1 / 448)`` like torch on CUDA, else as ``amax / 448`` like torch on the CPU;
    ``block_k`` (a power of two) sets the columns per loop step. No host sync: CUDA-graph
    capturable."""
    shape = x.shape
    x2 = as_rows(x)
    num_rows, num_cols = x2.shape
    q = torch.empty((num_rows, num_cols), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    if num_rows:
        if scale_by_reciprocal is None:
            scale_by_reciprocal = x.device.type == 'cuda'
        if block_k is None:
            block_k = min(next_power_of_2(num_cols), MAX_BLOCK_K)
        if num_warps is None:
            num_warps = max(1, min(8, block_k // 512))
        is_bf16 = x2.dtype == torch.bfloat16
        _fp8_quant_kernel[(num_rows,)](
            x2.view(torch.int16) if is_bf16 else x2, q.view(torch.uint8), scale, x2.stride(0),
            K=num_cols, BLOCK_K=block_k, NUM_BLOCKS=-(-num_cols // block_k), BF16_BITS=is_bf16,
            SCALE_BY_RECIPROCAL=bool(scale_by_reciprocal),
            INV_FP8_MAX=_INV_FP8_MAX, FP8_MAX=FP8_MAX, TINY=_TINY, num_warps=num_warps)
    return q.view(shape), scale.view(*shape[:-1], 1)


def fp8_quant(x: torch.Tensor, *, use_triton: bool = False):
    """Validated per-token e4m3 quantisation of x (..., K), bf16 / fp16 / float32, K >= 1;
    ``use_triton`` selects the kernel (CUDA tensors, or any under TRITON_INTERPRET=1), else
    ``quantize_rows``. Returns ``(q, scale)`` as ``quantize_rows`` does."""
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() < 1:
        raise ValueError(f'x must be a bfloat16, float16 or float32 tensor with at least one '
                         f'dim, got {getattr(x, "dtype", type(x).__name__)}')
    if x.shape[-1] < 1:
        raise ValueError(f'x must have at least one column, got shape {tuple(x.shape)}')
    if use_triton:
        check_can_launch(x.device)
        return quantize_rows_triton(x)
    return quantize_rows(x)
