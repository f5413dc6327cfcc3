"""kernels/fp8_producers.py: the RMS norm and the SwiGLU activation writing e4m3 codes for FP8
projections. The contract is bit-exact against the two launches each kernel replaces (the
producer's own kernel, then kernels/fp8_quant.py's), checked under ``TRITON_INTERPRET=1`` on
random inputs and on CUDA where a GPU is present; then the engine: an FP8 model with the
producers gives the tokens of the same model whose products quantise their own inputs."""
import importlib.util

import numpy as np
import pytest
import torch

from kernels import quantize_rows_triton, rms_norm_ref, rms_norm_triton, silu_mul_triton
from kernels.fp8_producers import (rms_norm_quant, rms_norm_quant_triton, silu_mul_quant,
                                   silu_mul_quant_ref, silu_mul_quant_triton)

HAS_TRITON = importlib.util.find_spec('triton') is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason='needs triton (the CPU interpreter)')
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def same_codes(a, b) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def assert_same_quantisation(got, want):
    (q, s), (q_want, s_want) = got, want
    assert same_codes(q, q_want)
    assert torch.equal(s, s_want)            # float32 scales, bit for bit (NaN: see below)


def rows(generator, num_rows, num_cols, dtype, scale=3.0):
    return (torch.randn(num_rows, num_cols, generator=generator) * scale).to(dtype)


# ---- under the interpreter ----------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('num_cols', [1, 40, 257])
def test_norm_codes_equal_the_norm_kernel_then_the_quantisation(interpret, dtype, num_cols):
    generator = torch.Generator().manual_seed(num_cols)
    x = rows(generator, 6, num_cols, dtype)
    weight = rows(generator, 1, num_cols, dtype, scale=1.0)[0]
    residual = rows(generator, 6, num_cols, dtype)
    x[2] = 0                                  # an all-zero row: the smallest scale, zero codes
    assert_same_quantisation(rms_norm_quant_triton(x, weight, 1e-5),
                             quantize_rows_triton(rms_norm_triton(x, weight, 1e-5)))
    total, q, s = rms_norm_quant_triton(x, weight, 1e-6, residual)
    total_want, y = rms_norm_triton(x, weight, 1e-6, residual)
    assert torch.equal(total, total_want)
    assert_same_quantisation((q, s), quantize_rows_triton(y))


@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
def test_norm_codes_of_strided_rows_and_both_scale_forms(interpret, dtype):
    """Rows of a wider tensor (a row stride other than the width), three dims, and the scale
    as torch computes it on CUDA (``amax * (1 / 448)``) as well as on the CPU."""
    generator = torch.Generator().manual_seed(7)
    wide = rows(generator, 2 * 5, 96, dtype).view(2, 5, 96)[:, :, 8:72]
    weight = rows(generator, 1, 64, dtype, scale=1.0)[0]
    for reciprocal in (False, True):
        got = rms_norm_quant_triton(wide, weight, 1e-5, scale_by_reciprocal=reciprocal)
        want = quantize_rows_triton(rms_norm_triton(wide, weight, 1e-5),
                                    scale_by_reciprocal=reciprocal)
        assert got[0].shape == (2, 5, 64) and got[1].shape == (2, 5, 1)
        assert_same_quantisation(got, want)


@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('num_cols,block_k', [(40, None), (200, 64), (257, 128)])
def test_activation_codes_equal_the_activation_kernel_then_the_quantisation(
        interpret, dtype, num_cols, block_k):
    """gate and up as the two halves of one fused product's output (row stride 2I), rows
    longer than one block (the kernel's two passes over its blocks)."""
    generator = torch.Generator().manual_seed(num_cols)
    gate_up = rows(generator, 5, 2 * num_cols, dtype, scale=4.0)
    gate, up = gate_up[:, :num_cols], gate_up[:, num_cols:]
    up[3] = 0
    for reciprocal in (False, True):
        got = silu_mul_quant_triton(gate, up, block_k=block_k, scale_by_reciprocal=reciprocal)
        want = quantize_rows_triton(silu_mul_triton(gate, up), scale_by_reciprocal=reciprocal)
        assert_same_quantisation(got, want)


@needs_triton
def test_a_nan_row_has_a_nan_scale_as_in_the_two_launches(interpret):
    """Outside the contract's finite inputs the row still fails loudly: a NaN scale, as the
    quantisation of the two launches gives (so the product is not finite either); other rows
    are untouched."""
    x = torch.randn(3, 32)
    x[1, 5] = float('nan')
    q, s = rms_norm_quant_triton(x, torch.ones(32), 1e-5)
    q_want, s_want = quantize_rows_triton(rms_norm_triton(x, torch.ones(32), 1e-5))
    assert torch.isnan(s[1]).all() and torch.isnan(s_want[1]).all()
    assert torch.equal(s[[0, 2]], s_want[[0, 2]]) and same_codes(q[[0, 2]], q_want[[0, 2]])


@needs_triton
def test_the_codes_stand_for_the_reference_norm_within_one_e4m3_step(interpret):
    """Against plain torch (the reference norm, quantised by the reference): the norm kernel
    may differ by an ulp, so codes may differ by one e4m3 step on a rounding boundary; the
    dequantised rows stay within e4m3's relative step (2^-3) of the reference norm."""
    generator = torch.Generator().manual_seed(3)
    x = rows(generator, 8, 128, torch.float32)
    weight = rows(generator, 1, 128, torch.float32, scale=1.0)[0]
    q, s = rms_norm_quant(x, weight, 1e-5, use_triton=True)
    want = rms_norm_ref(x, weight, 1e-5)
    back = q.to(torch.float32) * s
    assert torch.all((back - want).abs() <= want.abs() * 2 ** -3 + s * 2 ** -9)
    q_ref, s_ref = rms_norm_quant(x, weight, 1e-5)
    assert torch.allclose(s, s_ref, rtol=1e-6, atol=0)
    close = (q.to(torch.float32) - q_ref.to(torch.float32)).abs() <= \
        q_ref.to(torch.float32).abs() * 2 ** -3 + 2 ** -9
    assert close.all()


@needs_triton
def test_the_activation_wrapper_runs_the_kernel_or_the_reference(interpret):
    generator = torch.Generator().manual_seed(5)
    gate, up = rows(generator, 4, 48, torch.bfloat16), rows(generator, 4, 48, torch.bfloat16)
    assert_same_quantisation(silu_mul_quant(gate, up, use_triton=True),
                             silu_mul_quant_triton(gate, up))
    assert_same_quantisation(silu_mul_quant(gate, up), silu_mul_quant_ref(gate, up))


def test_the_wrappers_refuse_what_the_contract_does_not_cover():
    x, weight = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(ValueError, match='x must be a bfloat16, float16 or float32'):
        rms_norm_quant(x.double(), weight.double(), 1e-5)
    with pytest.raises(ValueError, match='at least one dim and one column'):
        rms_norm_quant(torch.randn(2, 0), torch.ones(0), 1e-5)
    with pytest.raises(ValueError, match=r'weight must be a contiguous \(8,\) tensor'):
        rms_norm_quant(x, torch.ones(8, dtype=torch.bfloat16), 1e-5)
    with pytest.raises(ValueError, match='residual must have the shape'):
        rms_norm_quant(x, weight, 1e-5, residual=torch.randn(2, 7))
    with pytest.raises(ValueError, match='eps must be > 0'):
        rms_norm_quant(x, weight, 0.0)
    with pytest.raises(ValueError, match='gate must be'):
        silu_mul_quant(torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8))
    with pytest.raises(ValueError, match='up must match gate'):
        silu_mul_quant(x, torch.randn(2, 9))


@needs_triton
def test_use_triton_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(ValueError, match='use_triton=True needs CUDA tensors or '
                                         'TRITON_INTERPRET=1'):
        rms_norm_quant(torch.randn(2, 8), torch.ones(8), 1e-5, use_triton=True)


# ---- unscaled FP8 products as inputs: the epilogue's scaling inside the consumer ----------

def unscaled_case(generator, num_rows, num_cols, dtype):
    """An unscaled tensor-wise FP8 product's ``acc`` (large values: codes times codes), its
    per-row and per-column float32 scales."""
    acc = (torch.randn(num_rows, num_cols, generator=generator) * 3000).to(dtype)
    x_scale = torch.rand(num_rows, 1, generator=generator) * 1e-2 + 1e-3
    w_scale = torch.rand(num_cols, generator=generator) * 1e-3 + 1e-4
    return acc, x_scale, w_scale


@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('num_cols', [40, 257])
def test_a_norm_adding_an_unscaled_product_equals_the_epilogue_then_the_norm(
        interpret, dtype, num_cols):
    """The residual add of the norm after o_proj and down: ``residual_scales`` applied in the
    norm's launch give the bits of kernels/fp8_epilogue.py's launch followed by the norm's,
    plain and quantising; the reference too."""
    from kernels import scale_product_ref, scale_product_triton
    generator = torch.Generator().manual_seed(num_cols + 1)
    x = rows(generator, 5, num_cols, dtype)
    weight = rows(generator, 1, num_cols, dtype, scale=1.0)[0]
    acc, x_scale, w_scale = unscaled_case(generator, 5, num_cols, dtype)
    delta = scale_product_triton(acc, x_scale, w_scale)
    total, y = rms_norm_triton(x, weight, 1e-5, acc, residual_scales=(x_scale, w_scale))
    total_want, y_want = rms_norm_triton(x, weight, 1e-5, delta)
    assert torch.equal(total, total_want) and torch.equal(y, y_want)
    got = rms_norm_quant_triton(x, weight, 1e-5, acc, residual_scales=(x_scale, w_scale))
    want = rms_norm_quant_triton(x, weight, 1e-5, delta)
    assert torch.equal(got[0], want[0])
    assert_same_quantisation(got[1:], want[1:])
    ref_total, ref_y = rms_norm_ref(x, weight, 1e-5, acc, (x_scale, w_scale))
    want_total, want_y = rms_norm_ref(x, weight, 1e-5, scale_product_ref(acc, x_scale, w_scale))
    assert torch.equal(ref_total, want_total) and torch.equal(ref_y, want_y)


@needs_triton
@pytest.mark.parametrize('dtype', DTYPES)
def test_the_activation_of_an_unscaled_gate_up_equals_the_epilogue_then_the_activation(
        interpret, dtype):
    """gate and up as the two halves of one unscaled fused product, each half with its own
    columns' scales: the bits of the epilogue followed by the activation, plain and
    quantising (rows longer than a block of the quantising kernel)."""
    from kernels import scale_product_triton
    from kernels.silu_mul import silu_mul_ref
    generator = torch.Generator().manual_seed(9)
    width = 200
    acc, x_scale, w_scale = unscaled_case(generator, 4, 2 * width, dtype)
    scales = (x_scale, w_scale[:width], w_scale[width:])
    scaled = scale_product_triton(acc, x_scale, w_scale)
    gate, up = acc[:, :width], acc[:, width:]
    assert torch.equal(silu_mul_triton(gate, up, scales),
                       silu_mul_triton(scaled[:, :width], scaled[:, width:]))
    assert_same_quantisation(
        silu_mul_quant_triton(gate, up, scales, block_k=64),
        silu_mul_quant_triton(scaled[:, :width], scaled[:, width:], block_k=64))
    from kernels import scale_product_ref
    scaled_ref = scale_product_ref(acc, x_scale, w_scale)
    assert torch.equal(silu_mul_ref(gate, up, scales),
                       silu_mul_ref(scaled_ref[:, :width], scaled_ref[:, width:]))


# ---- compiled for CUDA ahead of time (no GPU needed) ------------------------------------

AOT_SCRIPT = r"""
import importlib, sys
import triton
from triton.backends.compiler import GPUTarget
try:
    from triton.backends.nvidia import compiler as nvidia
    nvidia.get_ptxas(90)
except Exception as error:              # no CUDA backend, or no ptxas that runs here
    print(f'cannot compile here: {error}')
    sys.exit(2)
P = importlib.import_module('kernels.fp8_producers')
Q = importlib.import_module('kernels.fp8_quant')
N = importlib.import_module('kernels.rms_norm')
S = importlib.import_module('kernels.silu_mul')
import triton.language as tl
from kernels._triton_util import with_helpers
quant = dict(SCALE_BY_RECIPROCAL=True, INV_FP8_MAX=Q._INV_FP8_MAX, FP8_MAX=448.0, TINY=Q._TINY)
norm_args = dict(x_ptr='*bf16', res_ptr='*bf16', w_ptr='*bf16', sum_ptr='*bf16',
                 xs_ptr='*fp32', ws_ptr='*fp32', stride_x='i32', stride_r='i32',
                 stride_s='i32', num_cols='i32', eps='fp32')
cases = [
    (P._rms_norm_quant_kernel, 16,
     dict(norm_args, q_ptr='*u8', scale_ptr='*fp32'),
     dict(HAS_RESIDUAL=True, ROUND_BEFORE_SCALE=True, BF16=True, BLOCK=4096,
          SCALED_RESIDUAL=True, **quant)),
    (P._silu_mul_quant_kernel, 8,
     dict(gate_ptr='*bf16', up_ptr='*bf16', q_ptr='*u8', scale_ptr='*fp32', xs_ptr='*fp32',
          wsg_ptr='*fp32', wsu_ptr='*fp32', stride_g='i32', stride_u='i32'),
     dict(K=11008, BLOCK_K=4096, NUM_BLOCKS=3, BF16=True, SCALED=True, **quant)),
    (Q._fp8_quant_kernel, 8,
     dict(x_ptr='*i16', q_ptr='*u8', scale_ptr='*fp32', stride_x='i32'),
     dict(K=4096, BLOCK_K=4096, NUM_BLOCKS=1, BF16_BITS=True, **quant)),
    (N._rms_norm_kernel, 16,
     dict(norm_args, out_ptr='*bf16', stride_o='i32'),
     dict(HAS_RESIDUAL=True, ROUND_BEFORE_SCALE=True, BLOCK=4096, COMPUTE_DTYPE=tl.float32,
          SCALED_RESIDUAL=True)),
]
for dtype, compute in (('bf16', tl.float32), ('fp64', tl.float64)):
    cases.append((S._silu_mul_kernel, 4,
                  dict(gate_ptr=f'*{dtype}', up_ptr=f'*{dtype}', out_ptr=f'*{dtype}',
                       xs_ptr='*fp32', wsg_ptr='*fp32', wsu_ptr='*fp32', stride_g='i32',
                       stride_u='i32', stride_o='i32', num_cols='i32'),
                  dict(BLOCK_COLS=1024, COMPUTE_DTYPE=compute, SCALED=dtype == 'bf16')))
for kernel, warps, signature, constants in cases:  # (LazyJit: its body and helpers)
    body = kernel.fn
    source = triton.compiler.ASTSource(
        fn=triton.jit(with_helpers(body, kernel.helpers)),
        signature={**signature, **{name: 'constexpr' for name in constants}},
        constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget('cuda', 90, 32),
                              options={'num_warps': warps})
    ptx = compiled.asm['ptx']
    print(body.__name__, 'ok', 'div.rn.f32' in ptx)
"""


@needs_triton
def test_the_kernels_compile_for_sm_90_with_their_shared_device_functions():
    """Without a GPU: the two producers and the quantisation kernel (whose device functions
    they share, bound per kernel by LazyJit's helpers) compile for sm_90 at the 7B widths,
    the codes' division an IEEE one (``div.rn.f32``); so do the norm and the activation with
    unscaled FP8 inputs (and the activation in float64, which never takes them)."""
    import os
    import pathlib
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    root = pathlib.Path(__file__).resolve().parents[1]
    env['PYTHONPATH'] = os.pathsep.join([str(root)] + [env['PYTHONPATH']]
                                        if env.get('PYTHONPATH') else [str(root)])
    done = subprocess.run([sys.executable, '-c', AOT_SCRIPT], capture_output=True, text=True,
                          timeout=600, env=env, cwd=root)
    if done.returncode == 2:
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:3] == [f'{name} ok True' for name in ('_rms_norm_quant_body',
                                                        '_silu_mul_quant_body',
                                                        '_fp8_quant_body')]
    assert [line.split()[:2] for line in lines[3:]] == [['_rms_norm_body', 'ok'],
                                                        ['_silu_mul_body', 'ok'],
                                                        ['_silu_mul_body', 'ok']]


# ---- the engine: the producers' codes are the products' own ------------------------------

@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
    return make_checkpoint('tiny', tmp_path_factory.mktemp('fp8p') / 'tiny', seed=4)


@needs_triton
def test_an_fp8_engine_with_the_producers_gives_the_tokens_without_them(
        interpret, folder, monkeypatch):
    """float32, every fused kernel on (the interpreter): an FP8 model whose norms and
    activations write the codes decodes exactly the tokens of the same model whose products
    quantise their own inputs (the same codes, by the kernels' contract), in AR and in the
    default mode; and the producers did run (three of the four products of every layer)."""
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.kernels import fp8_producers
    from vla_spec_ros.models import fp8 as fp8_model

    calls = {'norm': 0, 'activation': 0}

    def counted(name, kernel):
        def run(*args, **kwargs):
            calls[name] += 1
            return kernel(*args, **kwargs)
        return run
    monkeypatch.setattr(fp8_producers, 'rms_norm_quant_triton',
                        counted('norm', fp8_producers.rms_norm_quant_triton))
    monkeypatch.setattr(fp8_producers, 'silu_mul_quant_triton',
                        counted('activation', fp8_producers.silu_mul_quant_triton))
    rng = np.random.default_rng(12)
    frames = [Frame(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), 'open the drawer',
                    'bridge_orig', 'cam') for _ in range(2)]
    tokens = {}
    for producers in (True, False):
        monkeypatch.setattr(fp8_model, 'QUANTIZE_IN_PRODUCERS', producers)
        for mode in ('ar', 'pipeline_spec'):
            policy = VLAPolicy.from_pretrained(str(folder), dtype='float32', weight_dtype='fp8',
                                               use_kernels='on', mode=mode)
            kernels = policy.engine.runner.kernels
            assert (kernels.rms_norm_quant is not None) == producers
            for frame in frames:
                policy.engine.submit(frame)
            done = sorted(policy.engine.run_until_idle(), key=lambda f: f.request_id)
            assert all(f.error is None for f in done), [f.error for f in done]
            tokens[producers, mode] = [tuple(f.result.tokens) for f in done]
    assert tokens[True, 'ar'] == tokens[False, 'ar'] == tokens[True, 'pipeline_spec'] \
        == tokens[False, 'pipeline_spec']
    assert calls['norm'] > 0 and calls['activation'] > 0


def cpu_scaled_mm_runs() -> bool:
    """Whether this torch's CPU ``_scaled_mm`` takes e4m3 operands with unit scales (torch
    2.13's does), so the tensor-wise route can run here."""
    try:
        one = torch.ones(())
        codes = torch.ones(16, 16).to(torch.float8_e4m3fn)
        torch._scaled_mm(codes, codes.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError):
        return False


def fused_fp8_variants(folder, monkeypatch, *, dtype: str, force_tensorwise: bool):
    """The engine (pipeline_spec, every fused kernel on) over two frames with the FP8
    consumers' scaling and the producers' quantisation each on and off: {(consumers,
    producers): (tokens, every forward's final hidden rows)}. ``force_tensorwise``: the FP8
    projections put on the tensor-wise ``_scaled_mm`` and fused as a CUDA runner does (a
    CPU's runner keeps the reference). Asserts that products came unscaled exactly when the
    consumers' switch was on."""
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.models import fp8 as fp8_model
    from vla_spec_ros.models.layers import fuse_projections

    unscaled_calls = []
    forward_unscaled = fp8_model.Fp8Linear.forward_unscaled

    def counted(self, x):
        unscaled_calls.append(self.out_features)
        return forward_unscaled(self, x)
    monkeypatch.setattr(fp8_model.Fp8Linear, 'forward_unscaled', counted)
    rng = np.random.default_rng(13)
    frames = [Frame(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), 'wipe the table',
                    'bridge_orig', 'cam') for _ in range(2)]
    out = {}
    for consumers in (True, False):
        for producers in (True, False):
            monkeypatch.setattr(fp8_model, 'SCALES_IN_CONSUMERS', consumers)
            monkeypatch.setattr(fp8_model, 'QUANTIZE_IN_PRODUCERS', producers)
            policy = VLAPolicy.from_pretrained(str(folder), dtype=dtype, weight_dtype='fp8',
                                               use_kernels='on', mode='pipeline_spec')
            language_model = policy.engine.runner.model.language_model
            if force_tensorwise:
                for module in language_model.modules():
                    if isinstance(module, fp8_model.Fp8Linear):
                        module.use_scaled_mm = True
                fuse_projections(language_model)
            seen, logits = [], language_model.logits

            def recorded(hidden, logits=logits, seen=seen):
                seen.append(hidden.clone())
                return logits(hidden)
            monkeypatch.setattr(language_model, 'logits', recorded)
            for frame in frames:
                policy.engine.submit(frame)
            done = sorted(policy.engine.run_until_idle(), key=lambda f: f.request_id)
            assert all(f.error is None for f in done), [f.error for f in done]
            out[consumers, producers] = (tuple(tuple(f.result.tokens) for f in done), seen)
            assert bool(unscaled_calls) == consumers, (consumers, len(unscaled_calls))
            unscaled_calls.clear()
    return out


def assert_one_function(variants) -> None:
    """Every variant's tokens and hidden rows, bit for bit, those of both switches off."""
    tokens, reference = variants[False, False]
    for got_tokens, rows in variants.values():
        assert got_tokens == tokens
        assert len(rows) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(rows, reference))


@needs_triton
@pytest.mark.skipif(not cpu_scaled_mm_runs(),
                    reason="this torch's CPU _scaled_mm does not run e4m3 with unit scales")
def test_on_the_tensorwise_route_the_scales_in_the_consumers_keep_the_tokens(
        interpret, folder, monkeypatch):
    """float32, the FP8 projections forced onto the tensor-wise ``_scaled_mm`` (this torch
    runs it on a CPU) and fused as a CUDA runner fuses them: with the scales applied by the
    norms' residual adds and the activation (``UnscaledProduct``) the engine decodes the
    tokens of the same route with its separate scaling launch, with and without the
    producers' quantisation (every forward's final hidden rows bit for bit); and the
    consumers did take unscaled products."""
    assert_one_function(fused_fp8_variants(folder, monkeypatch, dtype='float32',
                                           force_tensorwise=True))


@needs_triton
@pytest.mark.skipif(not cpu_scaled_mm_runs(),
                    reason="this torch's CPU _scaled_mm does not run e4m3 with unit scales")
@pytest.mark.parametrize('down_is_fp8', [True, False])
def test_an_mlp_takes_unscaled_products_only_into_a_kernel_that_scales_them(
        interpret, down_is_fp8):
    """SwiGLU with FP8 gate/up on the tensor-wise route, every combination of kernels it may
    be given: whatever takes gate and up (the quantising activation only when down is FP8,
    the plain kernel, or plain torch) gets them scaled, so the output is the one the same
    kernels give without unscaled products, bit for bit (before, a quantiser given beside a
    bf16 down left plain torch with unscaled gate and up)."""
    from kernels.fp8_producers import silu_mul_quant_triton as quantizer
    from vla_spec_ros.models import fp8 as fp8_model
    from vla_spec_ros.models.layers import SwiGLU, fuse_projections
    torch.manual_seed(0)
    mlp = SwiGLU(64, 96)
    for name in ('gate_proj', 'up_proj') + (('down_proj',) if down_is_fp8 else ()):
        linear = fp8_model.Fp8Linear.from_linear(getattr(mlp, name), torch.float32)
        linear.use_scaled_mm = True                     # the tensor-wise route
        setattr(mlp, name, linear)
    fuse_projections(mlp)
    x = torch.randn(5, 64)
    with torch.no_grad():
        for kernel in (None, silu_mul_triton):
            for given in (None, quantizer):
                want = mlp.forward(x, kernel, given)
                got = fp8_model.scaled(mlp.forward(x, kernel, given, unscaled=True))
                assert torch.equal(got, want), (kernel, given)


# ---- on a GPU -----------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()),
                                reason='needs triton and a CUDA device')


@needs_cuda
@pytest.mark.parametrize('num_rows', [1, 4, 280])
def test_on_cuda_the_fused_kernels_equal_the_two_launches_at_the_7b_shape(num_rows):
    """bf16 at OpenVLA-7B's widths (hidden 4096, intermediate 11008), compiled: the same
    codes, scales and residual sums as the two launches on the GPU."""
    generator = torch.Generator(device='cuda').manual_seed(num_rows)
    x = torch.randn(num_rows, 4096, device='cuda', generator=generator).to(torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.rand(4096, device='cuda', generator=generator).to(torch.bfloat16) + 0.5
    total, q, s = rms_norm_quant_triton(x, weight, 1e-6, residual)
    total_want, y = rms_norm_triton(x, weight, 1e-6, residual)
    assert torch.equal(total, total_want)
    assert_same_quantisation((q, s), quantize_rows_triton(y))
    assert_same_quantisation(rms_norm_quant_triton(x, weight, 1e-6),
                             quantize_rows_triton(rms_norm_triton(x, weight, 1e-6)))
    gate_up = (torch.randn(num_rows, 2 * 11008, device='cuda', generator=generator) * 3).to(
        torch.bfloat16)
    gate, up = gate_up[:, :11008], gate_up[:, 11008:]
    assert_same_quantisation(silu_mul_quant_triton(gate, up),
                             quantize_rows_triton(silu_mul_triton(gate, up)))


@needs_cuda
@pytest.mark.parametrize('num_rows', [1, 4, 280])
def test_on_cuda_unscaled_inputs_give_the_bits_of_the_scaling_launch_first(num_rows):
    """bf16 at the 7B widths, compiled: the norm adding an unscaled o / down product and the
    activation of an unscaled gate/up product (plain and quantising) give the bits of
    kernels/fp8_epilogue.py's launch followed by them."""
    from kernels import scale_product_triton
    generator = torch.Generator().manual_seed(num_rows + 7)
    x = torch.randn(num_rows, 4096, generator=generator).to('cuda', torch.bfloat16)
    weight = (torch.rand(4096, generator=generator) + 0.5).to('cuda', torch.bfloat16)
    acc, x_scale, w_scale = (t.to('cuda') for t in unscaled_case(generator, num_rows, 4096,
                                                                 torch.bfloat16))
    delta = scale_product_triton(acc, x_scale, w_scale)
    got = rms_norm_triton(x, weight, 1e-6, acc, residual_scales=(x_scale, w_scale))
    want = rms_norm_triton(x, weight, 1e-6, delta)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    got = rms_norm_quant_triton(x, weight, 1e-6, acc, residual_scales=(x_scale, w_scale))
    want = rms_norm_quant_triton(x, weight, 1e-6, delta)
    assert torch.equal(got[0], want[0])
    assert_same_quantisation(got[1:], want[1:])
    acc, x_scale, w_scale = (t.to('cuda') for t in unscaled_case(generator, num_rows, 2 * 11008,
                                                                 torch.bfloat16))
    scaled = scale_product_triton(acc, x_scale, w_scale)
    scales = (x_scale, w_scale[:11008], w_scale[11008:])
    assert torch.equal(silu_mul_triton(acc[:, :11008], acc[:, 11008:], scales),
                       silu_mul_triton(scaled[:, :11008], scaled[:, 11008:]))
    assert_same_quantisation(silu_mul_quant_triton(acc[:, :11008], acc[:, 11008:], scales),
                             silu_mul_quant_triton(scaled[:, :11008], scaled[:, 11008:]))


needs_fp8_cuda = pytest.mark.skipif(
    not (HAS_TRITON and torch.cuda.is_available()
         and torch.cuda.get_device_capability() >= (8, 9)),
    reason='needs triton and a CUDA GPU with FP8 tensor cores (sm_89+)')


@needs_fp8_cuda
def test_on_cuda_the_fused_fp8_route_is_the_function_of_the_separate_launches(folder,
                                                                              monkeypatch):
    """bf16 on the GPU as the runner sets it up (the tensor-wise ``_scaled_mm``, fused
    projections, compiled kernels): the producers' quantisation and the consumers' scaling,
    each on and off, give the same tokens and hidden rows bit for bit."""
    assert_one_function(fused_fp8_variants(folder, monkeypatch, dtype='bfloat16',
                                           force_tensorwise=False))
