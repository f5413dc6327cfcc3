"""The fused-kernel paths inside the engine (Triton under TRITON_INTERPRET=1 on CPU) give the
plain AR reference's tokens: RoPE + KV write, norms and the SwiGLU activation in AR and
pipelined modes, the segment attention kernel (``attention_backend: ring``) in the pipelined
modes."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from reference import ar_reference_tokens

triton = pytest.importorskip('triton', reason='triton is not installed')


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_checkpoint('tiny', tmp_path_factory.mktemp('kernels') / 'tiny', seed=3)


def test_kernel_path_matches_reference_tokens(folder, monkeypatch):
    from vla_spec_ros import VLAPolicy
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    rng = np.random.default_rng(5)
    frames = [Frame(rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), text, 'libero_goal')
              for text in ('open the drawer', 'push the red block to the left', 'close it')]
    plain = VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='off')
    expected = ar_reference_tokens(plain, frames)
    fused = VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='on')
    kernels = fused.engine.runner.kernels
    assert kernels.rope_kv_write is not None and plain.engine.runner.kernels.rope_kv_write is None
    assert kernels.rms_norm is not None and plain.engine.runner.kernels.rms_norm is None
    assert kernels.silu_mul is not None and plain.engine.runner.kernels.silu_mul is None
    # The fused norm and activation really run: count their launches through the forwards.
    launches, activations = [], []

    def counting(*args, **kwargs):
        launches.append(len(args) + len(kwargs) > 3)      # True: with the residual add
        return kernels.rms_norm(*args, **kwargs)

    def counting_activation(gate, up):
        activations.append(gate.shape[0])
        return kernels.silu_mul(gate, up)
    monkeypatch.setattr(fused.engine.runner, 'kernels', replace(
        kernels, rms_norm=counting, silu_mul=counting_activation))
    for mode in ('ar', 'pipeline'):
        engine = Engine(fused.engine.runner, fused.engine.norm_stats,
                        EngineConfig(mode=mode, dtype='float64', use_kernels='on'))
        for f in frames:
            engine.submit(f)
        got = {fin.request_id: fin.result.tokens for fin in engine.run_until_idle()}
        assert [got[i] for i in sorted(got)] == expected, mode
    # Per forward: the first layer's input norm alone; every later norm (each layer's
    # post-attention norm, the next layer's input norm, the final norm) adds the residual.
    num_layers = len(fused.engine.runner.lm.model.layers)
    assert launches.count(False) > 0
    assert launches.count(True) == 2 * num_layers * launches.count(False)
    assert len(activations) == num_layers * launches.count(False)     # one per layer


def test_kernels_on_without_triton_backend_is_refused(folder, monkeypatch):
    from vla_spec_ros import VLAPolicy
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the kernel path is available')
    with pytest.raises(ValueError, match='use_kernels'):
        VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='on')


def test_ring_attention_backend_gives_the_reference_tokens(folder, monkeypatch):
    """``attention_backend: ring``: every segment of the pipelined steps (decode roots, draft
    trees, several prompts per step) goes through the segment attention kernel, and the
    tokens are the plain AR reference's in float64. The draft head's forwards go through it
    too (and, with ``use_kernels: on``, through the RoPE, norm and activation kernels): every
    draft forward's output equals the plain draft head's."""
    from vla_spec_ros import VLAPolicy, kernels
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    rng = np.random.default_rng(9)
    frames = [Frame(rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), text, 'libero_goal',
                    f'cam{i % 2}')
              for i, text in enumerate(('open the drawer', 'push the red block to the left',
                                        'close it', 'pick up the cup'))]
    plain = VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='off')
    expected = ar_reference_tokens(plain, frames)
    launches, in_draft = [], [False]

    def counting(q, *args):
        launches.append(in_draft[0])        # True: launched by a draft forward
        return kernel(q, *args)
    kernel = kernels.segment_attention_triton
    monkeypatch.setattr(kernels, 'segment_attention_triton', counting)

    def run(policy, mode, backend):
        """-> (engine, tokens per frame, every draft forward's output in order)."""
        runner = policy.engine.runner
        cfg = EngineConfig(mode=mode, dtype='float64', use_kernels=policy.config.use_kernels,
                           attention_backend=backend, max_prefills_per_step=2,
                           draft_path='random', tree_max_nodes=12)
        draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
        draft_outputs = []
        if draft is not None:
            draft.head.register_forward_pre_hook(
                lambda module, args: in_draft.__setitem__(0, True))

            def record(module, args, out):
                in_draft[0] = False
                draft_outputs.append(out.clone())
            draft.head.register_forward_hook(record)
        engine = Engine(runner, policy.engine.norm_stats, cfg, draft=draft)
        for f in frames:
            engine.submit(f)
        finished = sorted(engine.run_until_idle(), key=lambda fin: fin.request_id)
        return engine, [fin.result.tokens for fin in finished], draft_outputs
    num_layers = len(plain.engine.runner.lm.model.layers)
    for mode in ('pipeline', 'pipeline_spec'):
        before = len(launches)
        engine, tokens, draft_outputs = run(plain, mode, 'ring')
        assert engine.strategy.verifier.kernels.segment_attention is counting
        assert tokens == expected, mode
        # One launch per layer of every step that has segments (all but the first).
        assert len(launches) - before >= num_layers * (engine.num_verifier_forwards - 1)
    # The drafter: gathered attention, the ring kernel, and the ring kernel with the fused
    # RoPE / norm / activation kernels give the same draft features forward by forward.
    assert engine.strategy.drafter.kernels.segment_attention is counting
    assert any(launches[before:])           # the draft forwards launched it themselves
    reference = run(plain, 'pipeline_spec', 'segments')[2]
    fused = VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='on')
    fused_engine, fused_tokens, fused_outputs = run(fused, 'pipeline_spec', 'ring')
    assert fused_engine.strategy.drafter.kernels.rms_norm is not None
    assert fused_tokens == expected
    for outputs in (draft_outputs, fused_outputs):
        assert len(outputs) == len(reference) > 3
        for got, want in zip(outputs, reference):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_ring_attention_backend_without_triton_backend_is_refused(folder, monkeypatch):
    from vla_spec_ros import VLAPolicy
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the ring kernel can run')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='off')
    with pytest.raises(ValueError, match='attention_backend'):
        Engine(policy.engine.runner, policy.engine.norm_stats,
               EngineConfig(mode='pipeline', dtype='float64', attention_backend='ring'))


@pytest.mark.parametrize('options', [{'attention_backend': 'ring'}, {'use_kernels': 'on'}])
def test_kernels_for_a_cpu_engine_on_a_cuda_machine_are_refused(folder, monkeypatch, options):
    """A CUDA device in the machine does not let a CPU engine launch Triton kernels: the
    choice is refused at load, naming the option, not at the first forward."""
    from vla_spec_ros import VLAPolicy
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='off')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    name = next(iter(options))
    with pytest.raises(ValueError, match=name):
        if name == 'use_kernels':
            VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='on')
        else:
            Engine(policy.engine.runner, policy.engine.norm_stats,
                   EngineConfig(mode='pipeline', dtype='float64', **options))
