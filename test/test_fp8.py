"""FP8 weights (``weight_dtype: fp8``, kernels/fp8_linear.py, models/fp8.py) on the CPU: the
quantisation's error bounds, the reference against a plain computation, the device wrapper's
arithmetic (``torch._scaled_mm`` also runs on a CPU) and its refusals, the model surgery, and
every decoding mode on a tiny random model with FP8 weights giving AR's tokens with the same
weights. The CUDA path itself is checked by the tests marked for a GPU (bench/gpu_suite.sh
fp8)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.kernels import (FP8_DTYPE, fp8_linear, fp8_linear_ref, fp8_linear_scaled_mm,
                                  quantize_rows, scaled_mm_unsupported_reason)
from vla_spec_ros.models import fp8 as fp8_model
from vla_spec_ros.models.fp8 import Fp8Linear, FusedFp8Linears, check_weight_dtype
from vla_spec_ros.models.layers import fuse_projections
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from kernel_checks import needs_cpu_rowwise_scaled_mm
from reference import ar_reference_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'bench'))
from gpu_fidelity import bin_distance_histogram  # noqa: E402

HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
NO_FP8_GPU = 'needs a CUDA GPU with FP8 tensor cores (sm_89+)'
INSTRUCTIONS = ('pick up the red cup', 'open the drawer', 'close it')
MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')


def random_weight(rows, cols, seed=0, dtype=torch.float32):
    """Rows of very different magnitudes (per-channel scales must follow each one)."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** torch.empty(rows, 1, dtype=torch.float64).uniform_(-4, 3, generator=gen)
    return (torch.randn(rows, cols, generator=gen, dtype=torch.float64) * magnitude).to(dtype)


# ---- quantisation and the reference


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_quantize_round_trip_error_is_bounded_per_row(dtype):
    """|w - q * scale| <= 2^-4 |w| (3 mantissa bits, round to nearest) for normal e4m3 values,
    <= 2^-10 scale (half the smallest subnormal step) below them; each row's largest
    magnitude maps to +-448 (the e4m3 maximum)."""
    w = random_weight(64, 96, seed=1, dtype=dtype)
    q, scale = quantize_rows(w)
    assert q.dtype == FP8_DTYPE and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (64, 1)
    w64 = w.to(torch.float64)
    back = q.to(torch.float64) * scale.to(torch.float64)
    bound = torch.maximum(w64.abs() * 2 ** -4, scale.to(torch.float64) * 2 ** -10)
    assert bool(((back - w64).abs() <= bound * (1 + 1e-6)).all())
    assert torch.equal(q.to(torch.float32).abs().amax(dim=1), torch.full((64,), 448.0))
    relative = (back - w64).norm(dim=1) / w64.norm(dim=1)
    assert float(relative.max()) < 0.04         # a row's error, whatever its magnitude


def test_quantize_keeps_zero_rows_and_stays_finite():
    w = torch.zeros(3, 32)
    w[1] = torch.linspace(-1e-30, 1e30, 32)
    q, scale = quantize_rows(w)
    assert torch.equal(q[0].to(torch.float32), torch.zeros(32)) and float(scale[0]) > 0
    assert bool(torch.isfinite(q.to(torch.float32)).all())


def plain_fp8_product(x, weight, weight_scale):
    """The contract written out independently: per-token scale amax / 448 in float32, the
    row divided, clamped, rounded to e4m3; both operands dequantised in float32 (float64 for
    float64), one matrix product, rounded to x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    x32 = x.float()
    x_scale = (x32.abs().max(dim=-1, keepdim=True).values / 448.0).clamp_min(
        torch.finfo(torch.float32).tiny)
    xq = torch.clamp(x32 / x_scale, -448.0, 448.0).to(torch.float8_e4m3fn)
    x_deq = xq.to(compute) * x_scale.to(compute)
    w_deq = weight.to(compute) * weight_scale.to(compute).unsqueeze(1)
    return F.linear(x_deq, w_deq).to(x.dtype)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_reference_equals_a_plain_dequantise_then_matmul(dtype):
    weight, weight_scale = quantize_rows(random_weight(48, 64, seed=2))
    weight_scale = weight_scale.reshape(-1)
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    got = fp8_linear_ref(x, weight, weight_scale)
    assert got.dtype == dtype and got.shape == (5, 3, 48)
    assert torch.equal(got, plain_fp8_product(x, weight, weight_scale))
    assert torch.equal(fp8_linear(x, weight, weight_scale), got)      # the wrapper's default


def test_reference_rows_do_not_depend_on_the_other_rows():
    """Per-token activation scales: a token is quantised the same alone or in any batch, so
    its output differs between batches only as an unquantised product's does (the matrix
    product's own summation order; what lets speculative verification reproduce AR's tokens
    in float64)."""
    weight, weight_scale = quantize_rows(random_weight(32, 64, seed=4))
    weight_scale = weight_scale.reshape(-1)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    x[2] *= 1000.0                                            # one loud token
    q, scale = quantize_rows(x)
    together = fp8_linear_ref(x, weight, weight_scale)
    for i in range(6):
        q_i, scale_i = quantize_rows(x[i:i + 1])
        assert torch.equal(q_i.view(torch.uint8), q[i:i + 1].view(torch.uint8))
        assert torch.equal(scale_i, scale[i:i + 1])
        torch.testing.assert_close(fp8_linear_ref(x[i:i + 1], weight, weight_scale),
                                   together[i:i + 1], rtol=1e-13, atol=0)


def fp8_tolerance(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What separates the scaled product from the reference: the accumulation order (float32
    either way) and the output's rounding, one ulp of ``dtype`` (plus float32 sums that cancel:
    a small share of the row's largest output)."""
    ulp = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}.get(dtype, 2 ** -20)
    r = ref.float().abs()
    return ulp * r + 2 ** -12 * r.amax(dim=-1, keepdim=True) + 1e-30


@needs_cpu_rowwise_scaled_mm
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_scaled_mm_launch_matches_the_reference_on_cpu(dtype):
    """The device path's operand layouts and scale shapes (row-major activations, the weight
    transposed to column-major, (T, 1) and (1, N) float32 scales) through the CPU's
    ``_scaled_mm``: the reference's values within the output dtype's rounding."""
    weight, weight_scale = quantize_rows(random_weight(80, 64, seed=6))
    weight_scale = weight_scale.reshape(-1)
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(7)).to(dtype)
    ref = fp8_linear_ref(x, weight, weight_scale)
    got = fp8_linear_scaled_mm(x, weight, weight_scale)
    assert got.dtype == dtype and got.shape == ref.shape
    assert bool(((got.float() - ref.float()).abs() <= fp8_tolerance(ref, dtype)).all())


def test_wrapper_refuses_what_it_cannot_run():
    weight, weight_scale = quantize_rows(random_weight(32, 64))
    weight_scale = weight_scale.reshape(-1)
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match='weight must be a 2-dim'):
        fp8_linear(x, weight.float(), weight_scale)
    with pytest.raises(ValueError, match='weight_scale must be float32 \\(32,\\)'):
        fp8_linear(x, weight, weight_scale[None])
    with pytest.raises(ValueError, match='does not match weight'):
        fp8_linear(torch.randn(3, 48), weight, weight_scale)
    with pytest.raises(ValueError, match='use_scaled_mm=True: the weights are on cpu'):
        fp8_linear(x, weight, weight_scale, use_scaled_mm=True)
    assert 'not a CUDA device' in scaled_mm_unsupported_reason(weight, torch.bfloat16)


def test_engine_option_and_load_time_refusals(monkeypatch):
    """weight_dtype takes auto or fp8; on CUDA fp8 needs sm_89+ and bfloat16 (the GPU answers
    are simulated: this checks the rules, not the device)."""
    with pytest.raises(ValueError, match='weight_dtype'):
        EngineConfig(weight_dtype='int8')
    assert EngineConfig().weight_dtype == 'auto'
    check_weight_dtype('fp8', torch.float32, torch.device('cpu'))      # the reference: any
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'a test GPU')
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: (8, 0))
    with pytest.raises(ValueError, match='weight_dtype: fp8 needs FP8 tensor cores.*sm_80'):
        check_weight_dtype('fp8', torch.bfloat16, torch.device('cuda'))
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: (9, 0))
    for dtype in (torch.float32, torch.float64, torch.float16):
        with pytest.raises(ValueError, match='weight_dtype: fp8 on CUDA needs dtype bfloat16'):
            check_weight_dtype('fp8', dtype, torch.device('cuda'))
    check_weight_dtype('auto', torch.float32, torch.device('cuda'))     # nothing to check
    # Whatever stops the probe product (a CUDA error, the activation kernel's compile error)
    # is refused at load with the reason, as a ValueError naming the option.

    def fails(*args):
        raise TypeError('a compile error')
    monkeypatch.setattr(fp8_model, 'fp8_linear_scaled_mm', fails)
    monkeypatch.setattr(fp8_model.torch, 'ones', lambda *a, **k: torch.zeros(16, 16))
    with pytest.raises(ValueError, match='weight_dtype: fp8: .* TypeError: a compile error'):
        check_weight_dtype('fp8', torch.bfloat16, torch.device('cuda'))


# ---- the model


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_checkpoint('tiny', tmp_path_factory.mktemp('fp8') / 'tiny', seed=1)


@pytest.fixture(scope='module')
def frames():
    rng = np.random.default_rng(11)
    return [Frame(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8),
                  INSTRUCTIONS[i % len(INSTRUCTIONS)], 'bridge_orig', f'cam{i % 2}')
            for i in range(12)]


def load(folder, **options):
    from vla_spec_ros import VLAPolicy
    return VLAPolicy.from_pretrained(str(folder), **options)


def test_only_the_decoder_projections_are_quantised(folder):
    auto = load(folder, dtype='float32', mode='ar').engine.runner.model
    model = load(folder, dtype='float32', weight_dtype='fp8', mode='ar').engine.runner.model
    state, before = model.state_dict(), auto.state_dict()
    projections = fp8_model.ATTENTION_PROJECTIONS + fp8_model.MLP_PROJECTIONS
    quantised = {k for k, v in state.items() if v.dtype == FP8_DTYPE}
    layers = model.language_model.model.layers
    assert quantised == {f'language_model.model.layers.{i}.{block}.{name}.weight'
                         for i in range(len(layers)) for name in projections
                         for block in ['self_attn' if name in fp8_model.ATTENTION_PROJECTIONS
                                       else 'mlp']}
    for key in quantised:               # scale beside each; dequantised close to the original
        scale = state[key + '_scale']
        assert scale.dtype == torch.float32 and scale.shape == (state[key].shape[0],)
        w = before[key]
        back = state[key].to(torch.float32) * scale[:, None]
        assert float((back - w).norm() / w.norm()) < 0.04, key
    for key, value in before.items():    # embeddings, lm_head, towers, projector, norms
        if key not in quantised:
            assert torch.equal(state[key], value), key
    attn = layers[0].self_attn
    assert isinstance(attn.q_proj, Fp8Linear) and not attn.q_proj.use_scaled_mm     # CPU


def test_fused_fp8_projections_equal_the_separate_ones(folder):
    """``fuse_projections`` on FP8 layers (what a CUDA runner does): one product of the
    concatenated weights and scales, the separate products' values; a replaced buffer
    makes the fusion step aside."""
    model = load(folder, dtype='float64', weight_dtype='fp8', mode='ar').engine.runner.model
    attn = model.language_model.model.layers[0].self_attn
    x = torch.randn(5, attn.q_proj.in_features, dtype=torch.float64)
    separate = [lin.forward(x) for lin in (attn.q_proj, attn.k_proj, attn.v_proj)]
    fuse_projections(model.language_model)
    assert isinstance(attn.fused, FusedFp8Linears)
    fused = attn.fused(x)
    for a, b in zip(fused, separate):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    attn.k_proj.weight_scale = attn.k_proj.weight_scale.clone()
    assert attn.fused(x) is None


def test_runners_sharing_a_model_must_agree_on_weight_dtype(folder):
    auto = load(folder, dtype='float32', mode='ar').engine.runner
    with pytest.raises(ValueError, match='weight_dtype: \'fp8\' on a model another runner '
                                         'serves with \'auto\''):
        ModelRunner(auto.model, auto.cfg, auto.tokenizer,
                    EngineConfig(dtype='float32', weight_dtype='fp8'))
    quantised = load(folder, dtype='float32', weight_dtype='fp8', mode='ar').engine.runner
    with pytest.raises(ValueError, match='weight_dtype: "auto" on a model whose decoder holds '
                                         'FP8 weights'):
        ModelRunner(quantised.model, quantised.cfg, quantised.tokenizer,
                    EngineConfig(dtype='float32'))
    again = ModelRunner(quantised.model, quantised.cfg, quantised.tokenizer,
                        EngineConfig(dtype='float32', weight_dtype='fp8'))
    assert again.model.language_model.model.layers[0].mlp.down_proj.weight.dtype == FP8_DTYPE


def run_engine(policy, frames, mode, **options):
    cfg = policy.config.replace(mode=mode, **options)
    engine = Engine(policy.engine.runner, policy.engine.norm_stats, cfg)
    for frame in frames:
        engine.submit(frame)
    out = engine.run_until_idle()
    assert all(f.error is None for f in out), [f.error for f in out]
    return [tuple(f.result.tokens) for f in sorted(out, key=lambda f: f.request_id)]


def test_every_mode_gives_the_ar_tokens_of_the_fp8_weights(folder, frames):
    """float64 (the exactness proof, as test_spec.py): each mode, the spec modes with the
    previous action (frames repeated) and with a random draft head, equals AR with the same
    FP8 weights."""
    policy = load(folder, dtype='float64', weight_dtype='fp8', mode='ar')
    repeated = [frames[i // 3] for i in range(12)]
    reference = ar_reference_tokens(policy, repeated)
    for mode in MODES:
        assert run_engine(policy, repeated, mode) == reference, mode
    for mode in ('spec', 'pipeline_spec'):
        got = run_engine(policy, repeated, mode, draft_path='random', tree_depth=3,
                         tree_max_nodes=12)
        assert got == reference, mode


def test_every_mode_runs_in_float32(folder, frames):
    """float32, as the option is described: every mode decodes whole actions of action
    tokens (the exactness proof is the float64 test above)."""
    policy = load(folder, dtype='float32', weight_dtype='fp8', mode='pipeline_spec')
    codec = policy.engine.runner.codec
    for mode in MODES:
        for tokens in run_engine(policy, frames[:6], mode, restrict_to_action_tokens=True):
            assert len(tokens) == codec.max_tokens
            assert all(codec.first_action_id <= t <= codec.last_action_id for t in tokens)
    action = policy.predict(frames[0].image, frames[0].instruction, 'bridge_orig')
    assert len(action.tokens) == codec.max_tokens


def test_bin_distance_against_the_unquantised_model(folder, frames):
    """The fidelity measure the GPU part records (FP8 against the model dtype, greedy over
    action tokens on both sides): computed over every token. A random tiny model's action
    logits are nearly flat, so quantisation moves many tokens far (about 40 % by 3+ bins on
    30 frames); what holds is that it changes some tokens and keeps some, and that the same
    weights give a histogram of zeros."""
    options = dict(dtype='float32', mode='ar', restrict_to_action_tokens=True)
    auto = load(folder, **options)
    quantised = load(folder, weight_dtype='fp8', **options)
    codec = auto.engine.runner.codec
    ours, theirs = ar_reference_tokens(quantised, frames), ar_reference_tokens(auto, frames)
    h = bin_distance_histogram(ours, theirs, codec.first_action_id, codec.last_action_id)
    assert h['tokens'] == len(frames) * codec.max_tokens == sum(h[b] for b in '0 1 2 3+'.split())
    assert h['frames'] == len(frames) and 0 < h['0'] < h['tokens']
    same = bin_distance_histogram(ours, ours, codec.first_action_id, codec.last_action_id)
    assert same['0'] == same['tokens'] and same['frames_exact'] == len(frames)


# ---- the device path (GPU machines)


@pytest.mark.skipif(not HAS_FP8_GPU, reason=NO_FP8_GPU)
@pytest.mark.parametrize('shape', [(1, 4096, 4096), (7, 4096, 11008), (300, 11008, 4096)])
def test_scaled_mm_matches_the_reference_on_the_gpu(shape):
    """bf16 activations, 7B shapes: ``_scaled_mm`` within a bf16 ulp (plus cancellation)
    of the dequantised reference."""
    rows, k, n = shape
    weight, weight_scale = quantize_rows(random_weight(n, k, seed=8).cuda())
    weight_scale = weight_scale.reshape(-1)
    x = torch.randn(rows, k, device='cuda', generator=torch.Generator('cuda').manual_seed(9))
    x = x.to(torch.bfloat16)
    assert scaled_mm_unsupported_reason(weight, torch.bfloat16) is None
    ref = fp8_linear_ref(x, weight, weight_scale)
    got = fp8_linear(x, weight, weight_scale, use_scaled_mm=True)
    assert got.dtype == torch.bfloat16
    assert bool(((got.float() - ref.float()).abs() <= fp8_tolerance(ref, torch.bfloat16)).all())


@pytest.mark.skipif(not HAS_FP8_GPU, reason=NO_FP8_GPU)
def test_cuda_runner_uses_scaled_mm_in_every_mode(folder, frames, monkeypatch):
    """bf16 on CUDA: every projection takes ``_scaled_mm`` (fused q/k/v and gate/up), CUDA
    graphs capture it, and every mode decodes the frames. float32 on CUDA is refused."""
    with pytest.raises(ValueError, match='weight_dtype: fp8 on CUDA needs dtype bfloat16'):
        load(folder, device='cuda', dtype='float32', weight_dtype='fp8')
    policy = load(folder, device='cuda', dtype='bfloat16', weight_dtype='fp8', mode='ar',
                  use_cuda_graphs=True)
    layers = policy.engine.runner.model.language_model.model.layers
    assert all(isinstance(layer.self_attn.fused, FusedFp8Linears) and
               layer.self_attn.o_proj.use_scaled_mm and layer.mlp.fused.fused.use_scaled_mm
               for layer in layers)
    calls = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, '_scaled_mm', lambda *a, **k: calls.append(1) or real(*a, **k))
    for mode in MODES:
        tokens = run_engine(policy, frames[:4], mode, restrict_to_action_tokens=True)
        assert len(tokens) == 4
    assert calls
