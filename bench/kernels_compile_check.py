"""Ahead-of-time CUDA compiles of the segment attention kernel: no GPU needed.

For each dtype, head shape, step shape and target, the kernel is compiled at the launch
``segment_attention_triton`` would make (``default_launch`` blocks and warps, the constants of
``kernel_constants``, pointers 16-byte aligned, integer arguments unspecialised) by Triton's own
compiler for a CUDA target, down to a cubin with the ptxas that ships in the Triton wheel. One
line each: ``ok`` with ptxas's register count and spill bytes, or ``FAIL`` with the error. This
catches what a GPU test run would only meet at the first launch, such as Triton 3.6's
"Currently fp64 don't support largeK MMA" for a float64 ``tl.dot``.

    python3 bench/kernels_compile_check.py                        # sm_80 and sm_90, all shapes
    python3 bench/kernels_compile_check.py --targets 90 --dtypes float64 --shapes 7b

Exit status: 0 when every compile succeeded, 1 when one failed, 2 when the check cannot run
here (no Triton, no CUDA backend in it, or its ptxas does not run). A compile that crashes the
process instead of raising stops the script; the line it was printing names the case.
"""
import argparse
import contextlib
import importlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop('TRITON_INTERPRET', None)    # triton.jit must build compilable kernels

import torch  # noqa: E402
from kernels_sweep import load_kernels  # noqa: E402

# name: (head_dim, q heads per kv head, [(Q, K) step shapes]); the 7B layer (32 q and kv heads
# of 128) and the ``tiny`` preset (4 heads of 16, the CUDA tests' float64 models), plus a GQA
# head of 32. A decode segment (Q = 1) and a block of rows pick different blocks.
SHAPES = {
    '7b': (128, 1, [(1, 300), (64, 300)]),
    'tiny': (16, 1, [(1, 40), (17, 40)]),
    'gqa32': (32, 2, [(1, 130), (40, 130)]),
}
DTYPES = {'float64': torch.float64, 'float32': torch.float32, 'bfloat16': torch.bfloat16,
          'float16': torch.float16}
POINTER_TYPES = {torch.float64: '*fp64', torch.float32: '*fp32', torch.bfloat16: '*bf16',
                 torch.float16: '*fp16'}
ARG_POINTER_TYPES = {'index_ptr': '*i64', 'mask_ptr': '*u8'}    # the others: the data dtype


class CannotRun(Exception):
    """The check cannot run on this machine (exit status 2)."""


def load_segment_attention():
    """The kernel's module in the package ``kernels_sweep.load_kernels`` finds (installed, else
    the source tree's kernels/ folder)."""
    return importlib.import_module(load_kernels().__name__ + '.segment_attention')


def ptxas_for(triton, nvidia, capability):
    """The ptxas Triton's CUDA backend uses for ``capability``; CannotRun if there is none."""
    try:
        try:
            return nvidia.get_ptxas(capability).path
        except (AttributeError, TypeError):     # a Triton without get_ptxas(arch)
            return triton.knobs.nvidia.ptxas.path
    except RuntimeError as error:               # Triton's "Cannot find ptxas"
        raise CannotRun(f'no ptxas for sm_{capability}: {error}') from None


def load_triton():
    """(triton, the CUDA backend's compiler module, ptxas version); CannotRun if unusable."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia import compiler as nvidia
    except ImportError as error:
        raise CannotRun(f'triton with its CUDA backend is not importable: {error}') from None
    ptxas = ptxas_for(triton, nvidia, 90)
    try:
        version = subprocess.run([ptxas, '--version'], capture_output=True, text=True,
                                 timeout=60, check=True).stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError) as error:
        raise CannotRun(f'ptxas ({ptxas}) does not run here: {error}') from None
    return triton, nvidia, version


@contextlib.contextmanager
def captured_stderr_fd():
    """Collects what native code writes to file descriptor 2 (MLIR and assertion messages)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode='w+') as sink:
        os.dup2(sink.fileno(), 2)
        lines = []
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().splitlines())


def reason(error, native_lines):
    """One line for a failed compile: the native assertion or MLIR error if any, else the
    exception's last line."""
    for pattern in ('Assertion', 'error:', 'fatal'):
        for line in native_lines:
            if pattern in line:
                return f'{type(error).__name__}: {line[line.index(pattern):][:200]}'
    text = str(error).strip().splitlines()
    return f'{type(error).__name__}: {text[-1][:200] if text else ""}'


def resource_usage(ptx, ptxas):
    """'regs N, spills S B' from ptxas -v on the kernel's PTX (its own target)."""
    arch = re.search(r'^\.target\s+(\w+)', ptx, re.M).group(1)
    with tempfile.NamedTemporaryFile('w', suffix='.ptx') as source:
        source.write(ptx)
        source.flush()
        log = subprocess.run([ptxas, '-v', f'--gpu-name={arch}', source.name, '-o', os.devnull],
                             capture_output=True, text=True, timeout=300).stderr
    regs = re.search(r'Used (\d+) registers', log)
    spills = re.search(r'(\d+) bytes spill stores', log)
    return (f'regs {regs.group(1) if regs else "?"}, '
            f'spills {spills.group(1) if spills else "?"} B')


def compile_case(triton, module, kernel, ptxas, dtype, head_dim, group, num_rows, num_cols,
                 capability):
    """Compile one launch; returns (blocks text, result text, ok)."""
    block_m, block_n, block_d, num_warps = module.default_launch(num_rows, num_cols, head_dim,
                                                                 dtype)
    blocks = f'{block_m}x{block_n}x{block_d} w{num_warps}'
    constants = module.kernel_constants(dtype, head_dim, group, head_dim ** -0.5, block_m,
                                        block_n, block_d)
    signature, attrs = {}, {}
    for index, param in enumerate(kernel.params):
        if param.is_constexpr:
            signature[param.name] = 'constexpr'
        elif param.name.endswith('_ptr'):
            signature[param.name] = ARG_POINTER_TYPES.get(param.name, POINTER_TYPES[dtype])
            attrs[(index,)] = [['tt.divisibility', 16]]
        else:
            signature[param.name] = 'i32'
    from triton.backends.compiler import GPUTarget
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants,
                                       attrs=attrs)
    with captured_stderr_fd() as native:
        try:
            compiled = triton.compile(source, target=GPUTarget('cuda', capability, 32),
                                      options={'num_warps': num_warps})
            error = None
        except Exception as caught:     # any compile failure is a result to print
            error = caught
    if error is not None:
        return blocks, 'FAIL ' + reason(error, native), False
    return blocks, 'ok   ' + resource_usage(compiled.asm['ptx'], ptxas), True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--targets', default='80,90',
                        help='CUDA compute capabilities, comma-separated (default 80,90)')
    parser.add_argument('--dtypes', default='float64,float32,bfloat16',
                        help=f'comma-separated, of {",".join(DTYPES)}')
    parser.add_argument('--shapes', default=','.join(SHAPES),
                        help=f'comma-separated, of {",".join(SHAPES)}')
    args = parser.parse_args(argv)
    try:
        return check(args)
    except CannotRun as error:
        print(f'cannot run: {error}')
        return 2


def check(args):
    """Print one line per case; the exit status (0: all compiled, 1: some failed)."""
    triton, nvidia, ptxas_version = load_triton()
    module = load_segment_attention()
    kernel = triton.jit(module._segment_attention_body)
    print(module.__file__)
    print(f'triton {triton.__version__} ({pathlib.Path(triton.__file__).parent}), '
          f'torch {torch.__version__}, ptxas for sm_90: {ptxas_version}')
    failures = 0
    begin = time.perf_counter()
    for capability in [int(x) for x in args.targets.split(',')]:
        for dtype_name in args.dtypes.split(','):
            for shape_name in args.shapes.split(','):
                head_dim, group, steps = SHAPES[shape_name]
                for num_rows, num_cols in steps:
                    label = (f'{dtype_name:9} {shape_name:6} D={head_dim:<3} G={group} '
                             f'Q={num_rows:<3} K={num_cols:<4} sm_{capability}')
                    ptxas = ptxas_for(triton, nvidia, capability)
                    print(label, end=' ', flush=True)
                    blocks, result, ok = compile_case(triton, module, kernel, ptxas,
                                                      DTYPES[dtype_name], head_dim, group,
                                                      num_rows, num_cols, capability)
                    print(f'{blocks:15} {result}', flush=True)
                    failures += not ok
    print(f'{failures} failed, {time.perf_counter() - begin:.1f} s')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
