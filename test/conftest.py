"""Test-session settings: one torch thread (the CI machine has 2 shared cores; two threads on
tiny matrices spend their time synchronising) and a private preset cache."""
import os
import tempfile

import pytest

os.environ.setdefault('VLA_SPEC_CACHE', tempfile.mkdtemp(prefix='vla-spec-test-cache-'))


@pytest.fixture(scope='session', autouse=True)
def one_torch_thread():
    try:
        import torch
    except ImportError:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def interpret(monkeypatch):
    """Triton kernels run in the CPU interpreter for this test only. Kernels are jitted at
    launch time (kernels/_triton_util.LazyJit), so the switch holds whatever was imported."""
    monkeypatch.setenv('TRITON_INTERPRET', '1')
