"""The fused (residual add +) RMSNorm kernel: its reference against the model's own RMSNorm and
Hugging Face's arithmetic, the Triton kernel against the reference on random shapes under
``TRITON_INTERPRET=1`` (and on CUDA in bf16 when present), and the wrapper's errors."""
import random

import pytest
import torch

try:
    from kernels.rms_norm import rms_norm, rms_norm_ref, rms_norm_triton
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels.rms_norm import rms_norm, rms_norm_ref, rms_norm_triton

from vla_spec_ros.models.layers import RMSNorm

from kernel_checks import assert_close, needs_cuda, needs_triton


def make_case(seed, dtype, device='cpu'):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    rows, cols = rng.randint(1, 7), rng.choice([16, 48, 100, 129])   # non-powers of two too
    scale = rng.choice([0.01, 1.0, 30.0])

    def randn(*shape):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)
    weight = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype=dtype, device=device)
    return randn(rows, cols), randn(rows, cols), weight, rng.choice([1e-6, 1e-5])


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_reference_is_the_model_rmsnorm(dtype):
    """The kernel's oracle is exactly the arithmetic the model runs without it."""
    x, residual, weight, eps = make_case(0, dtype)
    norm = RMSNorm(x.shape[-1], eps).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        assert torch.equal(rms_norm_ref(x, weight, eps), norm.forward(x))
        total, y = rms_norm_ref(x, weight, eps, residual)
        assert torch.equal(total, x + residual) and torch.equal(y, norm.forward(x + residual))


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize('seed', range(4))
def test_triton_matches_reference(interpret, dtype, seed):
    x, residual, weight, eps = make_case(seed, dtype)
    assert_close(rms_norm_triton(x, weight, eps), rms_norm_ref(x, weight, eps))
    total, y = rms_norm_triton(x, weight, eps, residual)
    want_total, want_y = rms_norm_ref(x, weight, eps, residual)
    if dtype == torch.bfloat16:     # the interpreter truncates to bf16 (exact on CUDA, below)
        assert_close(total, want_total)
    else:
        assert torch.equal(total, want_total)
    assert_close(y, want_y)


@needs_triton
def test_triton_keeps_leading_dims_and_reads_strided_rows(interpret):
    x, _, weight, eps = make_case(5, torch.float32, 'cpu')
    wide = torch.randn(3, 2, 2 * x.shape[-1])
    strided = wide[..., :x.shape[-1]]                  # rows one stride apart, not contiguous
    strided_weight = torch.randn(x.shape[-1])
    assert_close(rms_norm_triton(strided, strided_weight, eps),
                 rms_norm_ref(strided, strided_weight, eps))
    assert rms_norm_triton(x[:0], weight, eps).shape == (0, x.shape[-1])


@needs_triton
def test_wrapper_runs_the_kernel_or_the_reference(interpret):
    x, residual, weight, eps = make_case(7, torch.float64)
    via_kernel = rms_norm(x, weight, eps, residual, use_triton=True)
    via_ref = rms_norm(x, weight, eps, residual)
    assert torch.equal(via_ref[1], rms_norm_ref(x, weight, eps, residual)[1])
    assert_close(via_kernel[1], via_ref[1])


@pytest.mark.parametrize('case, message', [
    ('weight_len', 'weight shape'), ('weight_dtype', 'must match x'),
    ('residual_shape', 'residual'), ('eps', 'eps'), ('int_x', 'floating')])
def test_wrapper_rejects_bad_input(case, message):
    x, residual, weight, eps = make_case(1, torch.float32)
    args = dict(x=x, weight=weight, eps=eps, residual=residual)
    if case == 'weight_len':
        args['weight'] = weight[:-1]
    elif case == 'weight_dtype':
        args['weight'] = weight.double()
    elif case == 'residual_shape':
        args['residual'] = residual[:, :-1]
    elif case == 'eps':
        args['eps'] = 0.0
    else:
        args['x'] = x.long()
    with pytest.raises(ValueError, match=message):
        rms_norm(**args)


@needs_cuda
@pytest.mark.parametrize('seed', range(3))
def test_triton_on_cuda_bf16(seed):
    eps = 1e-6
    torch.manual_seed(seed)
    x = torch.randn(5, 4096, device='cuda').to(torch.bfloat16)
    residual = torch.randn_like(x)
    weight = (1 + 0.1 * torch.randn(4096, device='cuda')).to(torch.bfloat16)
    total, y = rms_norm_triton(x, weight, eps, residual)
    want_total, want_y = rms_norm_ref(x, weight, eps, residual)
    assert torch.equal(total, want_total)
    assert_close(y, want_y)
    assert_close(rms_norm_triton(x, weight, eps), rms_norm_ref(x, weight, eps))


def test_model_norm_uses_its_kernel_for_inference_only():
    """A kernel passed to the norm runs under no_grad / inference; with gradients enabled
    (training through the verifier) the norm stays plain torch, which has a backward."""
    calls = []

    def kernel(x, weight, eps, residual=None):
        calls.append(residual is not None)
        return rms_norm_ref(x, weight, eps, residual)
    norm = RMSNorm(8, 1e-6)
    x, delta = torch.randn(3, 8), torch.randn(3, 8)
    norm.forward(x, kernel).sum().backward()
    norm.add_and_norm(x, delta, kernel)
    assert calls == []
    with torch.no_grad():
        y = norm.forward(x, kernel)
        total, y2 = norm.add_and_norm(x, delta, kernel)
        assert torch.equal(norm.forward(x), y)           # no kernel: plain torch, same values
    assert calls == [False, True]
    assert torch.equal(total, x + delta)
    assert torch.equal(y2, rms_norm_ref(x + delta, norm.weight, 1e-6))
    assert torch.equal(y, rms_norm_ref(x, norm.weight.detach(), 1e-6))


@needs_cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_triton_on_cuda_other_dtypes(dtype):
    """float32 (Triton's fast square root and division stay within the tolerance) and fp16,
    with a strided residual."""
    torch.manual_seed(7)
    x = torch.randn(6, 4096, device='cuda').to(dtype)
    residual = torch.randn(6, 2 * 4096, device='cuda').to(dtype)[:, ::2]
    weight = (1 + 0.1 * torch.randn(4096, device='cuda')).to(dtype)
    total, y = rms_norm_triton(x, weight, 1e-5, residual)
    want_total, want_y = rms_norm_ref(x, weight, 1e-5, residual)
    assert torch.equal(total, want_total)
    assert_close(y, want_y)
