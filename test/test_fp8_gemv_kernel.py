"""The FP8 decode kernel (kernels/fp8_gemv.py) against its float64 reference: under
``TRITON_INTERPRET=1`` on random shapes (rows 1 to 40, widths that are not multiples of the
tile), every finite e4m3 code on both operands (subnormals and signs), both output dtypes; the
wrapper's refusals; ``fp8_linear_device`` choosing it for a few rows and ``_scaled_mm`` for
more, both equal to the dequantised reference; and on a GPU with FP8 tensor cores (skipped
otherwise) the 7B shapes, a CUDA-graph replay, and a decode step of an FP8 runner going
through the kernel."""
import importlib

import pytest
import torch

try:
    # The module, not the package's function of the same name.
    fp8_linear_module = importlib.import_module('kernels.fp8_linear')
    from kernels.fp8_gemv import MAX_ROWS, fp8_gemv, fp8_gemv_ref, fp8_gemv_triton
    from kernels.fp8_linear import fp8_linear_device, fp8_linear_ref
    from kernels.fp8_quant import FP8_DTYPE, quantize_rows
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    fp8_linear_module = importlib.import_module('vla_spec_ros.kernels.fp8_linear')
    from vla_spec_ros.kernels.fp8_gemv import MAX_ROWS, fp8_gemv, fp8_gemv_ref, fp8_gemv_triton
    from vla_spec_ros.kernels.fp8_linear import fp8_linear_device, fp8_linear_ref
    from vla_spec_ros.kernels.fp8_quant import FP8_DTYPE, quantize_rows

from kernel_checks import CPU_ROWWISE_SCALED_MM, assert_close, needs_triton

HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
NO_FP8_GPU = 'needs a CUDA GPU with FP8 tensor cores (sm_89+)'


def assert_close_to_reference(got, ref):
    """float32 sums in another order than the reference's (which dequantises before it
    multiplies): within float32 rounding of the largest output, not of each element, since an
    element that cancels keeps the rounding of the terms it summed."""
    assert got.dtype == ref.dtype and not got.isnan().any()
    rtol = 1e-5 if ref.dtype == torch.float32 else 2 * 2.0 ** -7     # bf16: two ulps
    torch.testing.assert_close(got, ref, rtol=rtol, atol=rtol * ref.abs().max().item())


def quantised(rows, cols, seed, device='cpu'):
    """(q, scale) of random rows of very different magnitudes, the scale as (rows,) for
    weights' use or (rows, 1) for activations' (the caller reshapes)."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** torch.empty(rows, 1, dtype=torch.float64).uniform_(-3, 2, generator=gen)
    x = (torch.randn(rows, cols, generator=gen, dtype=torch.float64) * magnitude).float()
    return quantize_rows(x.to(device))


@needs_triton
@pytest.mark.parametrize('rows, n, k', [(1, 48, 64), (3, 40, 300), (16, 64, 512),
                                        (17, 33, 256), (40, 96, 130)])
@pytest.mark.parametrize('out_dtype', [torch.float32, torch.bfloat16])
def test_kernel_matches_the_float64_reference(interpret, rows, n, k, out_dtype):
    xq, x_scale = quantised(rows, k, seed=rows * 31 + n)
    wq, w_scale = quantised(n, k, seed=n * 17 + k)
    w_scale = w_scale.reshape(-1)
    got = fp8_gemv(xq, x_scale, wq, w_scale, out_dtype, use_triton=True)
    assert_close(got, fp8_gemv_ref(xq, x_scale, wq, w_scale, out_dtype))


@needs_triton
def test_kernel_decodes_every_finite_e4m3_code(interpret):
    """Each of the 254 finite codes (NaN's two excluded), on the activations against one-hot
    weights and on the weights against a one-hot row: the product picks each code out alone,
    so a wrong exponent, mantissa, sign or subnormal decode shows as a wrong element."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    k = codes.numel()                                         # 254 columns
    values = codes.view(FP8_DTYPE)
    eye = torch.eye(k).to(FP8_DTYPE)
    ones_k, ones_1 = torch.ones(k), torch.ones(1, 1)
    # Activations: one row holding every code, times the identity: out[0, j] = code j.
    out = fp8_gemv(values[None], ones_1, eye, ones_k, torch.float32, use_triton=True)
    assert torch.equal(out[0], values.float())
    # Weights: every code as its own output channel's single non-zero weight.
    weight = torch.zeros(k, k, dtype=torch.uint8)
    weight[torch.arange(k), torch.arange(k)] = codes
    one_hot_rows = torch.eye(k)[:3].to(FP8_DTYPE)
    out = fp8_gemv(one_hot_rows, torch.ones(3, 1), weight.view(FP8_DTYPE), ones_k,
                   torch.float32, use_triton=True)
    assert torch.equal(out, torch.diag(values.float())[:3])


@needs_triton
def test_kernel_tiles_give_the_same_products(interpret):
    """Other tiles (narrower channels, shorter K steps than the product's K) compute the same
    products: the sums differ in order only."""
    xq, x_scale = quantised(5, 300, seed=1)
    wq, w_scale = quantised(70, 300, seed=2)
    w_scale = w_scale.reshape(-1)
    ref = fp8_gemv_ref(xq, x_scale, wq, w_scale, torch.float32)
    for block_n, block_k in ((16, 64), (64, 128), (32, 512)):
        got = fp8_gemv_triton(xq, x_scale, wq, w_scale, torch.float32, block_n=block_n,
                              block_k=block_k)
        assert_close(got, ref)


def test_wrapper_refuses_what_it_cannot_run():
    xq, x_scale = quantised(2, 32, seed=3)
    wq, w_scale = quantised(16, 32, seed=4)
    w_scale = w_scale.reshape(-1)
    with pytest.raises(ValueError, match='xq must be a 2-dim'):
        fp8_gemv(xq.float(), x_scale, wq, w_scale)
    with pytest.raises(ValueError, match='disagree on K'):
        fp8_gemv(xq[:, :16], x_scale, wq, w_scale)
    with pytest.raises(ValueError, match=r'x_scale must be float32 \(2, 1\)'):
        fp8_gemv(xq, x_scale.reshape(-1), wq, w_scale)
    with pytest.raises(ValueError, match=r'weight_scale must be float32 \(16,\)'):
        fp8_gemv(xq, x_scale, wq, w_scale[:8])
    with pytest.raises(ValueError, match='out_dtype'):
        fp8_gemv(xq, x_scale, wq, w_scale, torch.int32)
    # The reference path needs no Triton and equals the reference.
    assert torch.equal(fp8_gemv(xq, x_scale, wq, w_scale, torch.float32),
                       fp8_gemv_ref(xq, x_scale, wq, w_scale, torch.float32))


@needs_triton
@pytest.mark.parametrize('rows', [1, 7, MAX_ROWS, MAX_ROWS + 1, 40])
def test_device_product_equals_the_dequantised_reference_either_side_of_the_row_limit(
        interpret, monkeypatch, rows):
    """``fp8_linear_device`` by the decode kernel's route: at most MAX_ROWS rows go to the
    kernel, more to ``_scaled_mm`` (which runs on a CPU too); the row-wise and tensor-wise
    routes never call it; all within float32 rounding of ``fp8_linear_ref``, with the
    activations quantised on the way. The row-wise product needs a CPU ``_scaled_mm`` that
    takes row-wise scales (torch 2.13's; 2.11's takes per-tensor ones only)."""
    if rows > MAX_ROWS and not CPU_ROWWISE_SCALED_MM:
        pytest.skip("more rows than the kernel's go row-wise: this torch's CPU _scaled_mm "
                    'takes no row-wise scales')
    calls = []
    real = fp8_linear_module.fp8_gemv_triton
    monkeypatch.setattr(fp8_linear_module, 'fp8_gemv_triton',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=gen) * 3
    wq, w_scale = quantised(48, 96, seed=5)
    w_scale = w_scale.reshape(-1)
    unit = torch.ones(())
    got = fp8_linear_device(x, wq, w_scale, product='gemv', unit_scale=unit)
    assert_close_to_reference(got, fp8_linear_ref(x, wq, w_scale))
    assert bool(calls) == (rows <= MAX_ROWS)
    calls.clear()
    for product in ('rowwise', 'tensorwise') if CPU_ROWWISE_SCALED_MM else ('tensorwise',):
        assert_close_to_reference(fp8_linear_device(x, wq, w_scale, product=product,
                                                    unit_scale=unit),
                                  fp8_linear_ref(x, wq, w_scale))
    assert not calls


# ---- the device path (GPU machines)


@pytest.mark.skipif(not HAS_FP8_GPU, reason=NO_FP8_GPU)
@pytest.mark.parametrize('rows, n, k', [(1, 12288, 4096), (8, 4096, 11008),
                                        (16, 22016, 4096), (3, 4096, 4096)])
def test_kernel_matches_the_reference_on_the_gpu(rows, n, k):
    xq, x_scale = quantised(rows, k, seed=rows + n, device='cuda')
    wq, w_scale = quantised(n, k, seed=k, device='cuda')
    w_scale = w_scale.reshape(-1)
    got = fp8_gemv(xq, x_scale, wq, w_scale, torch.bfloat16, use_triton=True)
    assert_close_to_reference(got, fp8_gemv_ref(xq, x_scale, wq, w_scale, torch.bfloat16))


@pytest.mark.skipif(not HAS_FP8_GPU, reason=NO_FP8_GPU)
def test_kernel_replays_in_a_cuda_graph_with_new_inputs():
    x = torch.randn(4, 4096, device='cuda', dtype=torch.bfloat16)
    wq, w_scale = quantised(4096, 4096, seed=6, device='cuda')
    w_scale = w_scale.reshape(-1)
    fp8_linear_device(x, wq, w_scale, product='gemv', unit_scale=None)  # compile outside
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear_device(x, wq, w_scale, product='gemv', unit_scale=None)
    x.copy_(torch.randn_like(x))
    out.fill_(float('nan'))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(out, fp8_linear_ref(x, wq, w_scale))
