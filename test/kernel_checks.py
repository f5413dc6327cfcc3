"""What the Triton kernel tests share: the skip marks and a dtype-aware closeness check (the
``interpret`` fixture that runs kernels in Triton's CPU interpreter is in conftest.py)."""
import pytest
import torch

try:
    from kernels import _triton_util
    from kernels.fp8_linear import fp8_linear_scaled_mm, quantize_rows
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels import _triton_util
    from vla_spec_ros.kernels.fp8_linear import fp8_linear_scaled_mm, quantize_rows

needs_triton = pytest.mark.skipif(not _triton_util.HAS_TRITON, reason='triton is not importable')
needs_cuda = pytest.mark.skipif(not (_triton_util.HAS_TRITON and torch.cuda.is_available()),
                                reason='needs triton and a CUDA device')


def _cpu_scaled_mm_takes_row_scales() -> bool:
    """Whether this torch's CPU ``_scaled_mm`` runs the row-wise product (per-token and
    per-channel scales): torch 2.13's does, 2.11's takes per-tensor scales only, some builds
    have none."""
    try:
        q, s = quantize_rows(torch.ones(16, 16))
        fp8_linear_scaled_mm(torch.ones(2, 16), q, s.reshape(-1))
        return True
    except Exception:      # noqa: BLE001 - whatever this torch raises, the cases skip
        return False


CPU_ROWWISE_SCALED_MM = _cpu_scaled_mm_takes_row_scales()
needs_cpu_rowwise_scaled_mm = pytest.mark.skipif(
    not CPU_ROWWISE_SCALED_MM, reason="this torch's CPU _scaled_mm takes no row-wise scales")

# (rtol, atol) per dtype: |a - e| <= atol + rtol * |e| (llm.c grows it with magnitude). bf16
# allows two units in the last place: Triton's CPU interpreter truncates float32 -> bf16 where
# torch rounds to nearest, and a kernel sums in another order. Files whose kernel is held
# tighter or looser pass their own table, with the reason beside it.
TOLERANCES = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-6),
              torch.bfloat16: (2 * 2.0 ** -7, 2.0 ** -7), torch.float16: (2e-3, 1e-3)}


def assert_close(actual, expected, tolerances=TOLERANCES):
    """Same dtype and shape, no NaN, and close within ``tolerances[expected.dtype]``."""
    rtol, atol = tolerances[expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not actual.isnan().any()
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
