"""Plumbing shared by the kernels in this folder: optional Triton, launch and argument checks.

Triton is an optional dependency: every kernel module imports cleanly without it and keeps its
plain-torch reference usable. Kernel bodies are jitted lazily (``LazyJit``) so that the
``TRITON_INTERPRET`` mode in force at *launch* time decides between the compiled GPU kernel and
Triton's CPU interpreter, independent of import order (a test can switch the interpreter on
for its own duration without re-importing anything).
"""
import os
import types

import torch

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # the reference path must keep working without Triton
    triton = None
    tl = None
    HAS_TRITON = False

INDEX_DTYPES = (torch.int64, torch.int32)


def is_interpret_mode() -> bool:
    """True when Triton kernels would run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    if HAS_TRITON:
        # The knob reads the environment on every access; it is what triton.jit consults.
        return bool(triton.knobs.runtime.interpret)
    return os.environ.get('TRITON_INTERPRET', '0').strip().lower() in ('1', 'true', 'on', 'yes')


def is_triton_available() -> bool:
    """True when the Triton path can run here: Triton imports and there is a GPU or interpreter."""
    return HAS_TRITON and (torch.cuda.is_available() or is_interpret_mode())


def can_launch_on(device) -> bool:
    """Whether a Triton launch can run on ``device``: a CUDA device with Triton, or any device
    under the CPU interpreter. (A GPU in the machine does not make CPU tensors launchable.)"""
    return HAS_TRITON and (torch.device(device).type == 'cuda' or is_interpret_mode())


def check_can_launch(device: torch.device) -> None:
    """Raise ValueError (field ``use_triton``) when a Triton launch cannot run on ``device``."""
    if not HAS_TRITON:
        raise ValueError('use_triton=True but triton is not importable')
    if not can_launch_on(device):
        raise ValueError(
            f'use_triton=True needs CUDA tensors or TRITON_INTERPRET=1 (tensors are on {device})')


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); tl.arange extents must be powers of two."""
    return 1 << max(0, int(n) - 1).bit_length()


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """(..., H) -> (N, H) view for row-wise kernels (a copy only when the rows cannot be
    addressed by one stride)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def compute_dtype(dtype: torch.dtype):
    """Triton dtype used for arithmetic: float64 stays float64, everything else runs in float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


class LazyJit:
    """A kernel body that is ``triton.jit``-ed on first launch, once per interpreter mode.

    ``kernel[grid](...)`` behaves like an ordinary jitted kernel. Holding two jitted versions
    (compiled and interpreted) lets one process run both without re-importing the module.
    ``helpers``: plain functions the body calls by name (device functions shared between
    kernels); each is jitted in the body's mode and bound to its name for the body alone. A
    helper jitted once at import would belong to the mode of that moment: the interpreter
    refuses a compiled one ("Cannot call @triton.jit'd outside of the scope of a kernel").
    """

    def __init__(self, fn, helpers=()):
        self.fn = fn
        self.helpers = tuple(helpers)
        self._by_mode = {}

    def jitted(self):
        """The body jitted for the mode in force now (with its helpers bound)."""
        is_interpret = is_interpret_mode()
        kernel = self._by_mode.get(is_interpret)
        if kernel is None:
            kernel = triton.jit(with_helpers(self.fn, self.helpers))
            self._by_mode[is_interpret] = kernel
        return kernel

    def __getitem__(self, grid):
        return self.jitted()[grid]


def with_helpers(fn, helpers):
    """``fn`` (a kernel body) with each of ``helpers`` jitted now and bound to its name in a
    copy of ``fn``'s globals (the modules' own names are untouched); ``fn`` itself when there
    are none. Each helper keeps its own module's globals and sees the other helpers too (one
    may call another). Triton reads a function's source through its code object, which the
    copies share; it resolves the names at compile time, after all are bound."""
    if not helpers:
        return fn
    spaces = [dict(helper.__globals__) for helper in helpers]
    bound = {helper.__name__: triton.jit(_rebound(helper, space))
             for helper, space in zip(helpers, spaces)}
    for space in spaces:
        space.update(bound)
    return _rebound(fn, {**fn.__globals__, **bound})


def _rebound(fn, namespace: dict):
    """A copy of the function ``fn`` whose globals are ``namespace``."""
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__, copy.__module__ = fn.__qualname__, fn.__module__
    copy.__annotations__ = dict(fn.__annotations__)
    return copy


# ---- argument checks shared by the validating wrappers (ValueError naming the argument) ----

def check_tensor(name: str, x, ndim: int) -> None:
    """``x`` must be a tensor with ``ndim`` dims."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f'{name} must be a torch.Tensor, got {type(x).__name__}')
    if x.dim() != ndim:
        raise ValueError(f'{name} must have {ndim} dims, got shape {tuple(x.shape)}')


def check_index_values(name: str, index: torch.Tensor, upper: int, is_unique: bool) -> None:
    """Values of ``index`` must lie in [0, upper) and, if ``is_unique``, be pairwise distinct.

    Reading the values back costs one device->host sync; the wrappers let a caller that builds
    indices from already-checked host bookkeeping skip this (``check_indices=False``).
    """
    if index.numel() == 0:
        return
    low, high = int(index.min()), int(index.max())
    if low < 0 or high >= upper:
        raise ValueError(f'{name} values must lie in [0, {upper}), got range [{low}, {high}]')
    if is_unique and torch.unique(index).numel() != index.numel():
        raise ValueError(f'{name} values must be unique (two rows would write the same slot)')
