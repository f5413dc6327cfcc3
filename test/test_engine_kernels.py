"""The fused-kernel path inside the engine (Triton under TRITON_INTERPRET=1 on CPU) gives the
same tokens as the plain-torch path, in AR and pipelined modes."""
import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.random_checkpoint import make_checkpoint

triton = pytest.importorskip('triton', reason='triton is not installed')


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('kernels') / 'tiny', seed=3)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


def test_kernel_path_matches_reference_tokens(policy, monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    rng = np.random.default_rng(5)
    frames = [Frame(rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), text, 'libero_goal')
              for text in ('open the drawer', 'push the red block to the left', 'close it')]
    expected = [policy.predict(f.image, f.instruction, f.unnorm_key).tokens for f in frames]
    engine = Engine(policy.engine.runner, policy.engine.norm_stats,
                    EngineConfig(mode='pipeline', dtype='float64', use_kernels='on'))
    assert engine._kernel is not None
    for f in frames:
        engine.submit(f)
    got = {fin.request_id: fin.result.tokens for fin in engine.run_until_idle()}
    assert engine.runner.kernel is engine._kernel
    assert [got[i] for i in sorted(got)] == expected
    # The shared runner goes back to plain torch as soon as a kernel-less engine steps.
    policy.predict(frames[0].image, frames[0].instruction, frames[0].unnorm_key)
    assert policy.engine.runner.kernel is None


def test_kernels_on_without_triton_backend_is_refused(policy, monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    import torch
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the kernel path is available')
    with pytest.raises(ValueError, match='use_kernels'):
        Engine(policy.engine.runner, policy.engine.norm_stats,
               EngineConfig(mode='pipeline', dtype='float64', use_kernels='on'))
