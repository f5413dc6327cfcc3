"""The fused SwiGLU activation ``silu(gate) * up``: its reference against the model's MLP and an
independent formula, the Triton kernel against the reference on random shapes under
``TRITON_INTERPRET=1`` (and on CUDA in bf16 / float32 when present, CUDA-graph capture
included), and the wrapper's errors."""
import random

import pytest
import torch

try:
    from kernels.silu_mul import BLOCK, silu_mul, silu_mul_ref, silu_mul_triton
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels.silu_mul import BLOCK, silu_mul, silu_mul_ref, silu_mul_triton

from vla_spec_ros.models.layers import SwiGLU

import kernel_checks
from kernel_checks import needs_cuda, needs_triton

# Tighter than the shared table in float64 / float32: each output is one exp, a division
# and a product, no sum whose order could differ (on CUDA Triton's exp differs from torch's by
# float32 ulps).
TOLERANCES = {**kernel_checks.TOLERANCES, torch.float64: (1e-13, 1e-13),
              torch.float32: (1e-6, 1e-6)}


def assert_close(actual, expected):
    kernel_checks.assert_close(actual, expected, TOLERANCES)


def fused_halves(seed, rows, cols, dtype, device='cpu'):
    """gate and up as the two halves of one (rows, 2 * cols) product output (row stride
    2 * cols), the layout the model's fused gate/up projection gives."""
    gen = torch.Generator().manual_seed(seed)
    both = (4 * torch.randn(rows, 2 * cols, generator=gen, dtype=torch.float64)).to(dtype)
    gate, up = both.to(device).split(cols, dim=-1)
    return gate, up


def test_reference_is_the_mlp_activation_and_the_formula():
    gate, up = fused_halves(0, 5, 12, torch.float64)
    expected = gate / (1 + torch.exp(-gate)) * up
    torch.testing.assert_close(silu_mul_ref(gate, up), expected, rtol=1e-14, atol=1e-14)
    mlp = SwiGLU(8, 12).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    with torch.no_grad():
        plain = mlp.forward(x)
        via_ref = mlp.forward(x, silu_mul_ref)
    assert torch.equal(plain, via_ref)       # the same operations, bit for bit


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16,
                                   torch.float16])
def test_kernel_matches_reference_on_random_shapes(interpret, dtype):
    rng = random.Random(1)
    for case in range(6):
        rows = rng.choice([1, 3, 8])
        cols = rng.choice([1, 7, 64, BLOCK - 1, BLOCK + 5])      # partial and several blocks
        gate, up = fused_halves(case, rows, cols, dtype)
        got = silu_mul_triton(gate, up)
        assert_close(got, silu_mul_ref(gate, up))


@needs_triton
def test_kernel_rounds_like_the_two_torch_operations(interpret):
    """The kernel rounds SiLU's output to the io dtype before the product, as
    ``F.silu(g) * u`` does. In float16 (which the interpreter rounds to nearest, like torch;
    bf16 it truncates) it then equals the two-rounding reference on all but a few elements
    (exp differing in the last float32 bit), and disagrees with a one-rounding product on a
    quarter of them, as the two references disagree with each other."""
    gate, up = fused_halves(7, 64, 512, torch.float16)
    got = silu_mul_triton(gate, up)
    two_roundings = silu_mul_ref(gate, up)
    one_rounding = (gate.float() / (1 + torch.exp(-gate.float())) * up.float()).half()

    def mismatch(a, b):
        return (a != b).float().mean().item()
    assert mismatch(got, two_roundings) < 0.005
    assert mismatch(two_roundings, one_rounding) > 0.1
    assert mismatch(got, one_rounding) > 0.1


@needs_triton
def test_kernel_accepts_leading_dims_and_contiguous_inputs(interpret):
    gen = torch.Generator().manual_seed(3)
    gate = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64)
    up = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64)
    got = silu_mul_triton(gate, up)
    assert got.shape == gate.shape
    assert_close(got, silu_mul_ref(gate, up))
    empty = torch.zeros(0, 5, dtype=torch.float64)
    assert silu_mul_triton(empty, empty).shape == (0, 5)


def test_wrapper_errors_name_the_argument():
    gate, up = fused_halves(0, 2, 4, torch.float64)
    with pytest.raises(ValueError, match='gate'):
        silu_mul(gate.long(), up)
    with pytest.raises(ValueError, match='up'):
        silu_mul(gate, up.float())
    with pytest.raises(ValueError, match='up'):
        silu_mul(gate, up[:1])
    with pytest.raises(ValueError, match='up'):
        silu_mul(gate, 'up')
    assert torch.equal(silu_mul(gate, up), silu_mul_ref(gate, up))


def test_wrapper_refuses_triton_without_a_backend(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the kernel can run')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    gate, up = fused_halves(0, 2, 4, torch.float64)
    with pytest.raises(ValueError, match='use_triton'):
        silu_mul(gate, up, use_triton=True)


@needs_triton
def test_wrapper_runs_the_kernel(interpret):
    gate, up = fused_halves(4, 3, 50, torch.float32)
    assert_close(silu_mul(gate, up, use_triton=True), silu_mul_ref(gate, up))


@needs_cuda
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
def test_kernel_matches_reference_on_cuda_at_the_7b_shape(dtype):
    for rows in (1, 64):
        gate, up = fused_halves(rows, rows, 11008, dtype, device='cuda')
        assert_close(silu_mul_triton(gate, up), silu_mul_ref(gate, up))


@needs_cuda
def test_kernel_replays_in_a_cuda_graph():
    gate, up = fused_halves(2, 8, 11008, torch.bfloat16, device='cuda')
    eager = silu_mul_triton(gate, up)
    silu_mul_triton(gate, up)                   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = silu_mul_triton(gate, up)
    new_gate, new_up = fused_halves(9, 8, 11008, torch.bfloat16, device='cuda')
    gate.copy_(new_gate)
    up.copy_(new_up)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, silu_mul_triton(gate, up))
    assert not torch.equal(out, eager)
