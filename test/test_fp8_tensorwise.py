"""The tensor-wise FP8 route (kernels/fp8_epilogue.py, ``fp8_linear_tensorwise``): the scale
kernel against its reference under ``TRITON_INTERPRET=1`` (random shapes, widths past one
block, bf16 and float32), the wrapper's refusals, the whole route against the dequantised
reference on the CPU (whose ``_scaled_mm`` runs tensor-wise too), and on a GPU with FP8 tensor
cores (skipped otherwise) the 7B shapes and a CUDA-graph replay."""
import pytest
import torch

try:
    from kernels.fp8_epilogue import scale_product, scale_product_ref
    from kernels.fp8_linear import fp8_linear_ref, fp8_linear_tensorwise
    from kernels.fp8_quant import quantize_rows
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels.fp8_epilogue import scale_product, scale_product_ref
    from vla_spec_ros.kernels.fp8_linear import fp8_linear_ref, fp8_linear_tensorwise
    from vla_spec_ros.kernels.fp8_quant import quantize_rows

from kernel_checks import assert_close, needs_triton

HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
NO_FP8_GPU = 'needs a CUDA GPU with FP8 tensor cores (sm_89+)'


def within_two_roundings(got, ref):
    """Two roundings of the output dtype (the product's, then the scales'), against the
    largest output: an element that cancels keeps the rounding of the terms it summed."""
    assert got.dtype == ref.dtype and not got.isnan().any()
    eps = torch.finfo(ref.dtype).eps
    torch.testing.assert_close(got, ref, rtol=2 * eps, atol=2 * eps * ref.abs().max().item())


def weight_and_input(rows, n, k, seed, device='cpu', dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** torch.empty(n, 1, dtype=torch.float64).uniform_(-3, 2, generator=gen)
    w = (torch.randn(n, k, generator=gen, dtype=torch.float64) * magnitude).float()
    wq, w_scale = quantize_rows(w.to(device))
    x = (torch.randn(rows, k, generator=gen) * 3).to(device=device, dtype=dtype)
    return x, wq, w_scale.reshape(-1)


@needs_triton
@pytest.mark.parametrize('rows, n', [(1, 7), (5, 1024), (3, 2500)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_scale_kernel_matches_the_reference(interpret, rows, n, dtype):
    gen = torch.Generator().manual_seed(rows * n)
    acc = (torch.randn(rows, n, generator=gen) * 1e4).to(dtype)
    x_scale = torch.rand(rows, 1, generator=gen) * 1e-2
    w_scale = torch.rand(n, generator=gen) * 1e-3
    got = scale_product(acc, x_scale, w_scale, use_triton=True)
    assert_close(got, scale_product_ref(acc, x_scale, w_scale))


def test_scale_wrapper_refuses_what_it_cannot_run():
    acc = torch.ones(2, 4)
    with pytest.raises(ValueError, match='acc must be'):
        scale_product(acc[0], torch.ones(2, 1), torch.ones(4))
    with pytest.raises(ValueError, match=r'x_scale must be float32 \(2, 1\)'):
        scale_product(acc, torch.ones(2), torch.ones(4))
    with pytest.raises(ValueError, match=r'w_scale must be float32 \(4,\)'):
        scale_product(acc, torch.ones(2, 1), torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match='float64 acc'):
        scale_product(acc.double(), torch.ones(2, 1), torch.ones(4), use_triton=True)


@pytest.mark.parametrize('rows', [1, 9, 40])
def test_tensorwise_route_equals_the_dequantised_reference_on_the_cpu(rows):
    x, wq, w_scale = weight_and_input(rows, 48, 96, seed=rows)
    got = fp8_linear_tensorwise(x, wq, w_scale, torch.ones(()))
    within_two_roundings(got, fp8_linear_ref(x, wq, w_scale))


@pytest.mark.skipif(not HAS_FP8_GPU, reason=NO_FP8_GPU)
@pytest.mark.parametrize('rows, n, k', [(1, 12288, 4096), (8, 4096, 11008),
                                        (280, 22016, 4096)])
def test_tensorwise_route_matches_the_reference_on_the_gpu(rows, n, k):
    x, wq, w_scale = weight_and_input(rows, n, k, seed=n, device='cuda', dtype=torch.bfloat16)
    got = fp8_linear_tensorwise(x, wq, w_scale, torch.ones((), device='cuda'))
    within_two_roundings(got, fp8_linear_ref(x, wq, w_scale))


@pytest.mark.skipif(not HAS_FP8_GPU, reason=NO_FP8_GPU)
def test_tensorwise_route_replays_in_a_cuda_graph_with_new_inputs():
    x, wq, w_scale = weight_and_input(4, 4096, 4096, seed=3, device='cuda', dtype=torch.bfloat16)
    unit = torch.ones((), device='cuda')
    fp8_linear_tensorwise(x, wq, w_scale, unit)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear_tensorwise(x, wq, w_scale, unit)
    x.copy_(torch.randn_like(x))
    out.fill_(float('nan'))
    graph.replay()
    torch.cuda.synchronize()
    within_two_roundings(out, fp8_linear_ref(x, wq, w_scale))
