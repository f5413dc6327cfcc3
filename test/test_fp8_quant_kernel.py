"""The one-launch per-token e4m3 quantisation (kernels/fp8_quant.py) against ``quantize_rows``:
byte for byte in the codes and bit for bit in the scales, under ``TRITON_INTERPRET=1`` on random
shapes and dtypes, strided and multi-block rows, every e4m3 rounding boundary, zero and
sub-normal rows, the clamp, both forms of the scale (the CPU's division, CUDA's reciprocal); the
wrapper's errors; and on CUDA when present (skipped otherwise) the same against torch's CUDA
reference, a CUDA-graph replay, and ``fp8_linear_scaled_mm`` against the reference
quantisation followed by the same ``torch._scaled_mm``."""
import random

import pytest
import torch

try:
    from kernels.fp8_quant import (FP8_DTYPE, FP8_MAX, fp8_quant, quantize_rows,
                                   quantize_rows_triton)
    from kernels.fp8_linear import fp8_linear_scaled_mm
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels.fp8_quant import (FP8_DTYPE, FP8_MAX, fp8_quant, quantize_rows,
                                                quantize_rows_triton)
    from vla_spec_ros.kernels.fp8_linear import fp8_linear_scaled_mm

from kernel_checks import needs_cuda, needs_triton

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TINY = torch.finfo(torch.float32).tiny
HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def random_rows(seed, num_rows, num_cols, dtype, device='cpu', pad=0):
    """Rows of very different magnitudes (10^-6 .. 10^3: each row's scale must follow its own
    amax), as a view with row stride ``num_cols + pad`` when ``pad`` (a slice of a wider
    buffer, like one projection's part of a fused output)."""
    gen = torch.Generator().manual_seed(seed)
    exponent = torch.empty(num_rows, 1, dtype=torch.float64).uniform_(-6, 3, generator=gen)
    magnitude = 10.0 ** exponent
    wide = torch.randn(num_rows, num_cols + pad, generator=gen, dtype=torch.float64) * magnitude
    return wide.to(dtype).to(device)[:, :num_cols]


def cuda_form_reference(x):
    """``quantize_rows`` as torch computes it on CUDA, written out on the CPU: the division of
    amax by the Python scalar 448 done as a product with float32(1 / 448)."""
    x32 = x.to(torch.float32)
    inverse = torch.tensor(1.0, dtype=torch.float32).div(FP8_MAX)
    scale = (x32.abs().amax(dim=-1, keepdim=True) * inverse).clamp_min(TINY)
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def assert_same_quantisation(got, expected):
    """Codes equal as bytes, scales equal as float32 (NaN scales in the same rows)."""
    (q, scale), (q_ref, scale_ref) = got, expected
    assert q.dtype == FP8_DTYPE and q.shape == q_ref.shape and q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == scale_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0))


def boundary_rows(num_cols=4096):
    """float32 rows led by 448 (scale exactly 1 in both forms, so each other element is its
    own quotient) holding every finite e4m3 value, every midpoint between neighbours (the
    ties, which round to the even code) and the float32 values either side of both, with
    both signs, plus signed zeros, the sub-normal grid's ties and float32 sub-normals."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).to(torch.float32)
    values = codes[torch.isfinite(codes)].unique()
    mids = (values[1:] + values[:-1]) / 2                  # exact in float32
    points = torch.cat([values, mids, torch.tensor([2.0 ** -10, 3 * 2.0 ** -10, 1e-45, 1e-40])])
    points = torch.cat([points, -points])
    points = torch.cat([points, torch.nextafter(points, torch.full_like(points, 1e30)),
                        torch.nextafter(points, torch.full_like(points, -1e30)),
                        torch.tensor([0.0, -0.0])]).clamp(-FP8_MAX, FP8_MAX)
    per_row = num_cols - 1
    num_rows = -(-points.numel() // per_row)
    body = torch.zeros(num_rows * per_row)
    body[:points.numel()] = points
    return torch.cat([torch.full((num_rows, 1), FP8_MAX), body.view(num_rows, per_row)], dim=1)


def clamped_rows(scale_by_reciprocal):
    """float32 rows whose amax divided by its rounded scale exceeds 448 (the clamp is what
    keeps that element at e4m3's largest value), found by search for the given scale form."""
    gen = torch.Generator().manual_seed(11)
    amax = torch.rand(20000, generator=gen) * 100 + 1e-3
    if scale_by_reciprocal:
        scale = amax * torch.tensor(1.0).div(FP8_MAX)
    else:
        scale = amax / FP8_MAX
    over = amax[amax / scale > FP8_MAX][:4]
    if over.numel() == 0:
        return None
    rows = torch.randn(over.numel(), 32, generator=gen).clamp(-1, 1) * over[:, None]
    rows[:, 3] = -over                                   # the amax, negative for half the check
    rows[:, 5] = over
    return rows


# ---- under the interpreter (any machine with triton)


@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
def test_kernel_matches_reference_on_random_shapes(interpret, dtype):
    """T in (1, 3, 300) and K in (16, 4096, 11008) (the 7B widths; 300 rows and 11,008 columns
    only where the interpreter stays quick), contiguous and strided rows."""
    rng = random.Random(int(dtype.itemsize))
    cases = [(1, 16), (3, 16), (300, 16), (1, 4096), (3, 4096), (1, 11008)]
    for case, (num_rows, num_cols) in enumerate(cases):
        pad = rng.choice([0, 16, 40])
        x = random_rows(case, num_rows, num_cols, dtype, pad=pad)
        assert_same_quantisation(quantize_rows_triton(x), quantize_rows(x))


@needs_triton
@pytest.mark.parametrize('block_k, num_cols', [(1024, 11008), (8, 40), (16, 16)])
def test_kernel_loops_over_blocks_of_a_row(interpret, block_k, num_cols):
    """Several blocks per row, the last one partial (11,008 = 10.75 x 1024; 40 = 5 x 8)."""
    x = random_rows(5, 3, num_cols, torch.bfloat16, pad=8)
    assert_same_quantisation(quantize_rows_triton(x, block_k=block_k), quantize_rows(x))


@needs_triton
@pytest.mark.parametrize('scale_by_reciprocal', [False, True])
def test_kernel_rounds_every_e4m3_boundary_like_torch(interpret, scale_by_reciprocal):
    """Round to nearest even on every e4m3 tie (normal and sub-normal), the values next to the
    ties, the binade carries, signed zeros (the sign kept, as c10 keeps it) and float32
    sub-normals: the codes torch's conversion gives."""
    x = boundary_rows()
    got = quantize_rows_triton(x, scale_by_reciprocal=scale_by_reciprocal)
    assert torch.equal(got[1], torch.ones_like(got[1]))
    assert_same_quantisation(got, quantize_rows(x))


@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
def test_kernel_keeps_zero_and_tiny_rows(interpret, dtype):
    """An all-zero row (scale float32 tiny, zero codes), a row of -0.0 (negative zero codes),
    a row whose amax / 448 is below float32's normal range (the tiny scale; float16 cannot
    hold it and has zeros there), and, in float32, a row of float32 sub-normals (quotients by
    the tiny scale)."""
    x = torch.zeros(4, 64, dtype=dtype)
    x[1] = -0.0
    x[2] = (torch.linspace(-4, 4, 64, dtype=torch.float64) * TINY).to(dtype)
    if dtype == torch.float32:
        x[3] = torch.linspace(-1e-39, 1e-39, 64)
    got = quantize_rows_triton(x)
    assert torch.equal(got[1][:3], torch.full((3, 1), TINY))
    assert torch.equal(got[0][1].view(torch.uint8), torch.full((64,), 0x80, dtype=torch.uint8))
    assert_same_quantisation(got, quantize_rows(x))


@needs_triton
@pytest.mark.parametrize('scale_by_reciprocal', [False, True])
def test_kernel_clamps_quotients_past_448(interpret, scale_by_reciprocal):
    """Rows whose amax over its rounded scale exceeds 448: that element's code is 448's (the
    reference's clamp). The division form has such rows (about one amax in ten); where the
    reciprocal form has none in the search the check runs on the division form's rows."""
    x = clamped_rows(scale_by_reciprocal)
    if x is None:
        x = clamped_rows(False)
    got = quantize_rows_triton(x, scale_by_reciprocal=scale_by_reciprocal)
    expected = (quantize_rows(x) if not scale_by_reciprocal else cuda_form_reference(x))
    assert_same_quantisation(got, expected)
    assert torch.equal(got[0][:, 5].to(torch.float32), torch.full((x.shape[0],), FP8_MAX))
    assert torch.equal(got[0][:, 3].to(torch.float32), torch.full((x.shape[0],), -FP8_MAX))


@needs_triton
def test_kernel_scale_forms_follow_the_device_reference(interpret):
    """The default form is the device's: CPU tensors get ``amax / 448`` (torch's CPU
    division), and the CUDA form ``amax * float32(1 / 448)`` equals the CUDA reference written
    out; the two forms differ in some rows, so mixing them up would show."""
    x = random_rows(7, 64, 48, torch.float32)
    division = quantize_rows_triton(x)
    assert_same_quantisation(division, quantize_rows(x))
    reciprocal = quantize_rows_triton(x, scale_by_reciprocal=True)
    assert_same_quantisation(reciprocal, cuda_form_reference(x))
    assert not torch.equal(division[1], reciprocal[1])


@needs_triton
@pytest.mark.filterwarnings('ignore::RuntimeWarning')       # numpy's inf / inf in the interpreter
def test_kernel_propagates_infinities_and_nans_as_the_reference(interpret):
    """Outside the contract's finite inputs: a row holding inf gets an inf scale (zero codes,
    NaN where the inf was), a row holding NaN a NaN scale and NaN codes, like the reference
    (the NaN codes' sign bit is not compared)."""
    x = torch.linspace(-3, 3, 96).view(3, 32).clone()
    x[1, 5] = float('inf')
    x[2, 7] = float('nan')
    q, scale = quantize_rows_triton(x)
    q_ref, scale_ref = quantize_rows(x)
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0))
    values, values_ref = q.to(torch.float32), q_ref.to(torch.float32)
    assert torch.equal(values.isnan(), values_ref.isnan())
    assert torch.equal(values.nan_to_num(7.0), values_ref.nan_to_num(7.0))


@needs_triton
def test_kernel_takes_leading_dims_any_strides_and_no_rows(interpret):
    x = random_rows(3, 6, 40, torch.bfloat16).view(2, 3, 40)
    q, scale = quantize_rows_triton(x)
    assert q.shape == (2, 3, 40) and scale.shape == (2, 3, 1)
    assert_same_quantisation((q, scale), quantize_rows(x))
    transposed = random_rows(4, 40, 5, torch.float16).t()       # last-dim stride 5: copied
    assert_same_quantisation(quantize_rows_triton(transposed), quantize_rows(transposed))
    q, scale = quantize_rows_triton(torch.zeros(0, 16, dtype=torch.bfloat16))
    assert q.shape == (0, 16) and q.dtype == FP8_DTYPE and scale.shape == (0, 1)


# ---- the validating wrapper


def test_wrapper_errors_name_the_argument():
    x = random_rows(0, 2, 16, torch.bfloat16)
    for bad in (x.double(), x.long(), x.to(FP8_DTYPE), 'x', torch.tensor(1.0)):
        with pytest.raises(ValueError, match='x must be'):
            fp8_quant(bad)
    with pytest.raises(ValueError, match='at least one column'):
        fp8_quant(torch.zeros(3, 0))
    assert_same_quantisation(fp8_quant(x), quantize_rows(x))


def test_wrapper_refuses_triton_without_a_backend(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the kernel can run')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    with pytest.raises(ValueError, match='use_triton'):
        fp8_quant(random_rows(0, 2, 16, torch.float32), use_triton=True)


@needs_triton
def test_wrapper_runs_the_kernel(interpret):
    x = random_rows(1, 3, 48, torch.float16)
    assert_same_quantisation(fp8_quant(x, use_triton=True), quantize_rows(x))


# ---- on CUDA (skipped without a GPU)


@needs_cuda
@pytest.mark.parametrize('dtype', DTYPES)
def test_kernel_matches_reference_on_cuda(dtype):
    """The 7B widths and row counts, contiguous and strided, against torch's own CUDA
    quantisation (the reciprocal form of the scale)."""
    for case, (num_rows, num_cols, pad) in enumerate(
            [(1, 4096, 0), (3, 4096, 16), (300, 4096, 0), (1, 11008, 0), (3, 11008, 64),
             (300, 11008, 0), (5, 16, 0), (2, 40, 8)]):
        x = random_rows(case, num_rows, num_cols, dtype, device='cuda', pad=pad)
        assert_same_quantisation(quantize_rows_triton(x), quantize_rows(x))
    for block_k in (1024, 512):
        x = random_rows(9, 3, 11008, dtype, device='cuda')
        assert_same_quantisation(quantize_rows_triton(x, block_k=block_k), quantize_rows(x))


@needs_cuda
def test_kernel_edge_rows_match_reference_on_cuda():
    """Every e4m3 boundary, signed zeros, zero and sub-normal rows, the clamp, on the GPU
    (its division, conversion and sub-normal handling against torch's CUDA kernels)."""
    x = boundary_rows().cuda()
    assert_same_quantisation(quantize_rows_triton(x), quantize_rows(x))
    edges = torch.zeros(3, 64, device='cuda')
    edges[1] = -0.0
    edges[2] = torch.linspace(-1e-39, 1e-39, 64, device='cuda')
    assert_same_quantisation(quantize_rows_triton(edges), quantize_rows(edges))
    clamped = clamped_rows(False).cuda()         # rows that clamp in the CPU form
    assert_same_quantisation(quantize_rows_triton(clamped), quantize_rows(clamped))


@needs_cuda
def test_kernel_replays_in_a_cuda_graph():
    x = random_rows(2, 8, 11008, torch.bfloat16, device='cuda')
    eager = quantize_rows_triton(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, scale = quantize_rows_triton(x)
    x.copy_(random_rows(3, 8, 11008, torch.bfloat16, device='cuda'))
    graph.replay()
    torch.cuda.synchronize()
    assert_same_quantisation((q, scale), quantize_rows(x))
    assert not torch.equal(scale, eager[1])


@needs_cuda
@pytest.mark.skipif(not HAS_FP8_GPU, reason='needs a CUDA GPU with FP8 tensor cores (sm_89+)')
def test_scaled_mm_path_equals_reference_quantisation_then_scaled_mm():
    """``fp8_linear_scaled_mm`` (the kernel's codes and scales) gives exactly what the
    reference quantisation followed by the same ``torch._scaled_mm`` gives, at the 7B widths
    (strided activations included: a slice of a wider buffer)."""
    for case, (num_rows, num_cols, num_out) in enumerate([(1, 4096, 4096), (7, 4096, 12288),
                                                          (300, 11008, 4096)]):
        weight, weight_scale = quantize_rows(random_rows(case, num_out, num_cols,
                                                         torch.float32, device='cuda'))
        weight_scale = weight_scale.reshape(-1).contiguous()
        x = random_rows(case + 10, num_rows, num_cols, torch.bfloat16, device='cuda', pad=16)
        got = fp8_linear_scaled_mm(x, weight, weight_scale)
        x_q, x_scale = quantize_rows(x)
        expected = torch._scaled_mm(x_q, weight.t(), scale_a=x_scale,
                                    scale_b=weight_scale.view(1, -1), out_dtype=torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
