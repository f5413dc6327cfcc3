"""Test-session settings: one torch thread (the CI machine has 2 shared cores; two threads on
tiny matrices spend their time synchronising) and a private preset cache."""
import os
import signal
import tempfile

import pytest

os.environ.setdefault('VLA_SPEC_CACHE', tempfile.mkdtemp(prefix='vla-spec-test-cache-'))

# A suite started as a shell's background job inherits SIGINT ignored, and so would every
# process it starts (an ignored signal stays ignored across exec): `ros2 launch` and the nodes
# the tests stop with SIGINT would never see it. A handled signal is reset to its default in
# a child, so the tests' processes get SIGINT as under a terminal or a supervisor.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
