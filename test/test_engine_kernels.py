"""The fused-kernel path inside the engine (Triton under TRITON_INTERPRET=1 on CPU) gives the
plain AR reference's tokens, in AR and pipelined modes."""
import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.random_checkpoint import make_checkpoint

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
    assert fused.engine.runner.kernel is not None and plain.engine.runner.kernel is None
    assert fused.engine.runner.norm_kernel is not None and plain.engine.runner.norm_kernel is None
    # The fused norm really runs: count its launches through the engine's forwards.
    launches = []
    norm_kernel = fused.engine.runner.norm_kernel

    def counting(*args, **kwargs):
        launches.append(len(args) + len(kwargs) > 3)      # True: with the residual add
        return norm_kernel(*args, **kwargs)
    monkeypatch.setattr(fused.engine.runner, 'norm_kernel', counting)
    for mode in ('ar', 'pipeline'):
        engine = Engine(fused.engine.runner, fused.engine.norm_stats,
                        EngineConfig(mode=mode, dtype='float64', use_kernels='on'))
        for f in frames:
            engine.submit(f)
        got = {fin.request_id: fin.result.tokens for fin in engine.run_until_idle()}
        assert [got[i] for i in sorted(got)] == expected, mode
    num_layers = len(fused.engine.runner.lm.model.layers)
    assert launches.count(True) >= num_layers and launches.count(False) > num_layers


def test_kernels_on_without_triton_backend_is_refused(folder, monkeypatch):
    from vla_spec_ros import VLAPolicy
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    import torch
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the kernel path is available')
    with pytest.raises(ValueError, match='use_kernels'):
        VLAPolicy.from_pretrained(str(folder), dtype='float64', use_kernels='on')
