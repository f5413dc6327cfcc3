"""The segment attention kernel: its reference against independent oracles, the Triton kernel
against the reference, and the wrapper's errors.

Layers: (1) ``segment_attention_ref`` against the computation it replaces in
``models/attention.attend_segments`` (gather K/V with index_select, then SDPA with the mask) and
against a per-row loop that takes the softmax over exactly the allowed slots; (2) the kernel
against the reference on random shapes under ``TRITON_INTERPRET=1`` (CPU) and, when present,
on CUDA at the 7B shape, with CUDA-graph capture and replay; its CUDA compile without a GPU
(``bench/kernels_compile_check.py``); (3) the wrapper's ValueErrors.
Kernels are jitted at launch time, so the ``interpret`` fixture turns the interpreter on for
one test only (monkeypatch.setenv) regardless of import order.
"""
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

try:
    from kernels.segment_attention import (FLOAT64_TILE, default_launch, segment_attention,
                                           segment_attention_ref, segment_attention_triton)
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels.segment_attention import (FLOAT64_TILE, default_launch,
                                                        segment_attention, segment_attention_ref,
                                                        segment_attention_triton)

from vla_spec_ros.models.attention import StepBatch, attend_segments

import kernel_checks
from kernel_checks import needs_cuda, needs_triton

# the module itself (``kernels.segment_attention`` is also the name of the package's function)
segment_attention_module = sys.modules[segment_attention_triton.__module__]

FLOAT_DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def dtype_id(dtype):
    return str(dtype).replace('torch.', '')


# The shared table (bf16: on CUDA p @ v also takes TF32 probabilities), with a looser float32
# atol: the sums run in another order (blocks with rescaling, inside tl.dot) over up to a few
# hundred slots.
TOLERANCES = {**kernel_checks.TOLERANCES, torch.float32: (1e-5, 1e-5)}


def assert_close(actual, expected):
    kernel_checks.assert_close(actual, expected, TOLERANCES)


def make_case(seed, dtype, num_segments, num_rows, num_cols, num_q_heads, num_kv_heads,
              head_dim, index_dtype=torch.int64, device='cpu'):
    """A random segments step. Each segment reads ``num_cols`` distinct slots drawn from one
    pool, so segments share slots; every mask row allows at least one slot (the engine's
    guarantee). Values are drawn in float64 on the CPU, then cast and moved."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = num_cols + 7

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q = 2 * randn(num_segments * num_rows, num_q_heads, head_dim)   # sharper than uniform
    k_cache = randn(num_slots, num_kv_heads, head_dim)
    v_cache = randn(num_slots, num_kv_heads, head_dim)
    kv_index = torch.stack([torch.randperm(num_slots, generator=gen)[:num_cols]
                            for _ in range(num_segments)]).reshape(num_segments, num_cols)
    seg_mask = torch.rand(num_segments, num_rows, num_cols, generator=gen) < 0.6
    forced = torch.randint(0, num_cols, (num_segments, num_rows, 1), generator=gen)
    seg_mask.scatter_(2, forced, True)
    case = dict(q=q.to(dtype), k_cache=k_cache.to(dtype), v_cache=v_cache.to(dtype),
                kv_index=kv_index.to(index_dtype), seg_mask=seg_mask)
    return {name: x.to(device) for name, x in case.items()}


def gather_sdpa(q, k_cache, v_cache, kv_index, seg_mask):
    """What the engine runs without the kernel: ``attend_segments`` on a step of segments only
    (gathered K/V copies, then SDPA with the mask)."""
    unused = kv_index.new_zeros(0)          # positions / slots: read by the KV write only
    return attend_segments(q, k_cache, v_cache, StepBatch(
        positions=unused, slot_mapping=unused, kv_index=kv_index, seg_mask=seg_mask))


def per_row_softmax(q, k_cache, v_cache, kv_index, seg_mask, scale):
    """One (row, head) at a time: softmax over exactly the allowed slots; none allowed -> 0."""
    num_segments, num_rows, _ = seg_mask.shape
    num_q_heads = q.shape[1]
    group = num_q_heads // k_cache.shape[1]
    out = torch.zeros_like(q)
    for s in range(num_segments):
        for i in range(num_rows):
            slots = kv_index[s, seg_mask[s, i]].long()
            if slots.numel() == 0:
                continue
            for h in range(num_q_heads):
                keys, values = k_cache[slots, h // group], v_cache[slots, h // group]
                weights = torch.softmax(keys @ q[s * num_rows + i, h] * scale, dim=0)
                out[s * num_rows + i, h] = weights @ values
    return out


# ---------------------------------------------------- (1) the reference vs independent oracles

@pytest.mark.parametrize('heads', [(4, 4), (4, 2), (2, 1)])
@pytest.mark.parametrize('seed', [0, 1])
def test_reference_equals_gather_and_sdpa(heads, seed):
    shape = [(3, 5, 9, 16), (2, 1, 40, 32)][seed]        # (S, Q, K, D)
    num_segments, num_rows, num_cols, head_dim = shape
    case = make_case(seed, torch.float64, num_segments, num_rows, num_cols, *heads, head_dim)
    expected = gather_sdpa(**case)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(segment_attention_ref(**case), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(segment_attention_ref(**case, scale=0.7),
                               per_row_softmax(**case, scale=0.7), rtol=1e-12, atol=1e-12)


def test_reference_equals_per_row_softmax_and_zeroes_empty_rows():
    case = make_case(3, torch.float64, 2, 4, 6, 4, 2, 8, index_dtype=torch.int32)
    case['kv_index'][1] = case['kv_index'][0]             # two segments on the same slots
    case['kv_index'][0, 4] = case['kv_index'][0, 1]       # a slot repeated inside a segment
    case['seg_mask'][0, 2] = False                        # a row that may read nothing
    case['seg_mask'][1, 0] = True                         # a row that reads every column
    expected = per_row_softmax(**case, scale=1 / math.sqrt(8))
    actual = segment_attention_ref(**case)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(actual[2], torch.zeros_like(actual[2]))
    assert actual.abs().sum(-1).gt(0).sum() == actual.shape[0] * actual.shape[1] - 4
    torch.testing.assert_close(segment_attention_ref(**case, scale=0.25),
                               per_row_softmax(**case, scale=0.25), rtol=1e-12, atol=1e-12)


def test_reference_rounds_once_in_low_precision():
    """bf16 inputs: float32 arithmetic throughout, one rounding of the result."""
    case = make_case(4, torch.bfloat16, 2, 3, 10, 2, 1, 16)
    wide = {name: x.float() if x.is_floating_point() else x for name, x in case.items()}
    actual = segment_attention_ref(**case)
    assert actual.dtype == torch.bfloat16
    assert torch.equal(actual, segment_attention_ref(**wide).to(torch.bfloat16))


# ------------------------------------------------------ (2) the Triton kernel vs its reference

def run_both(case, **triton_kwargs):
    expected = segment_attention_ref(**case)
    actual = segment_attention_triton(**case, **triton_kwargs)
    assert expected.abs().max() > 0.05                    # never zeros against zeros
    assert_close(actual, expected)
    return actual, expected


# (S, Q, K, Hq, Hkv, D, index dtype): each value of the sweep appears at least once.
KERNEL_CASES = [
    (1, 1, 1, 4, 4, 16, torch.int64),      # decode row, a single slot
    (3, 1, 64, 4, 2, 32, torch.int32),     # decode rows, GQA, one full column block
    (3, 3, 5, 2, 1, 64, torch.int64),
    (1, 17, 130, 4, 2, 16, torch.int32),   # several row and column blocks, partial last ones
    (3, 40, 64, 2, 1, 24, torch.int64),    # head_dim not a power of two (lanes masked)
    (1, 40, 130, 4, 4, 32, torch.int64),
    (3, 17, 5, 4, 4, 24, torch.int32),
    (1, 3, 130, 2, 1, 64, torch.int32),
]


@needs_triton
@pytest.mark.parametrize('dtype', FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize('shape', KERNEL_CASES, ids=lambda s: 'S{}Q{}K{}H{}-{}D{}-{}'.format(
    *s[:6], str(s[6])[-5:]))
def test_triton_matches_reference(interpret, dtype, shape):
    *sizes, index_dtype = shape
    run_both(make_case(sum(sizes), dtype, *sizes, index_dtype=index_dtype))


@needs_triton
def test_triton_float16(interpret):
    run_both(make_case(21, torch.float16, 2, 5, 20, 4, 2, 32))


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16], ids=dtype_id)
def test_triton_segments_share_and_repeat_slots(interpret, dtype):
    case = make_case(8, dtype, 3, 4, 12, 4, 2, 16)
    case['kv_index'][2] = case['kv_index'][0]             # segments 0 and 2 read the same slots
    case['kv_index'][1, 5:] = case['kv_index'][1, 0]      # one slot in many columns
    case['seg_mask'][1, :, 5:] = True
    case['seg_mask'][2] = case['seg_mask'][0]
    case['q'][8:12] = case['q'][0:4]
    actual, _ = run_both(case)
    # identical segments give identical rows: the kernel addresses slots, not positions
    assert torch.equal(actual[8:12], actual[0:4])


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_reads_strided_inputs(interpret, dtype):
    """q as the rows after a prefill block, sliced out of a fused qkv output (row stride
    > Hq * D, a row offset); kv_index every other column of a wider table; seg_mask one row
    expanded over Q (stride 0)."""
    num_segments, num_rows, num_cols, num_q_heads, num_kv_heads, head_dim = 2, 5, 9, 4, 2, 16
    case = make_case(9, dtype, num_segments, num_rows, num_cols, num_q_heads, num_kv_heads,
                     head_dim)
    num_prefill = 3
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_prefill + num_segments * num_rows, width, dtype=torch.float64)
    qkv = qkv.to(dtype)
    q = qkv[num_prefill:, :num_q_heads * head_dim].view(-1, num_q_heads, head_dim)
    assert not q.is_contiguous() and q.stride(0) == width
    wide_index = torch.stack([case['kv_index'], case['kv_index'].flip(1)], -1).flatten(1)
    kv_index = wide_index[:, ::2]
    assert torch.equal(kv_index, case['kv_index']) and kv_index.stride(1) == 2
    seg_mask = case['seg_mask'][:, :1].expand(-1, num_rows, -1)
    assert seg_mask.stride(1) == 0
    strided = dict(case, q=q, kv_index=kv_index, seg_mask=seg_mask)
    actual, _ = run_both(strided)
    contiguous = dict(strided, q=q.contiguous(), kv_index=kv_index.contiguous(),
                      seg_mask=seg_mask.contiguous())
    assert torch.equal(actual, segment_attention_triton(**contiguous))


@needs_triton
@pytest.mark.parametrize('dtype', FLOAT_DTYPES, ids=dtype_id)
def test_triton_rows_without_allowed_slot_are_zero(interpret, dtype):
    case = make_case(10, dtype, 3, 17, 40, 2, 1, 16)
    case['seg_mask'][0, 3] = False
    case['seg_mask'][0, 16] = False                       # the last row of a partial block
    case['seg_mask'][2] = False                           # a whole segment reads nothing
    actual, expected = run_both(case)
    empty = torch.zeros(17 * 3, dtype=torch.bool)
    empty[[3, 16]] = True
    empty[34:] = True
    assert torch.equal(actual[empty], torch.zeros_like(actual[empty]))
    assert torch.equal(expected[empty], torch.zeros_like(expected[empty]))
    assert actual[~empty].abs().sum(-1).gt(0).all()


@needs_triton
def test_triton_scale_is_exact_in_float64(interpret):
    """The scale reaches the float64 kernel unrounded (a float32 scale is off by ~1e-8)."""
    case = make_case(11, torch.float64, 2, 3, 20, 2, 2, 32)
    for scale in (0.3, 1 / math.sqrt(3)):
        assert_close(segment_attention_triton(**case, scale=scale),
                     segment_attention_ref(**case, scale=scale))


@needs_triton
@pytest.mark.parametrize('dtype, blocks', [(torch.float64, (16, 16)), (torch.bfloat16, (16, 16)),
                                           (torch.float64, (2, 8))],
                         ids=lambda x: dtype_id(x) if isinstance(x, torch.dtype) else
                         'x'.join(map(str, x)))
def test_triton_explicit_small_blocks(interpret, dtype, blocks):
    """Small blocks (float64, without tl.dot, also below 16): many row and column blocks per
    program set, the last ones partial."""
    case = make_case(12, dtype, 1, 40, 70, 2, 1, 24)
    run_both(case, block_m=blocks[0], block_n=blocks[1], num_warps=4)


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32], ids=dtype_id)
def test_triton_runtime_loop_bound(interpret, monkeypatch, dtype):
    """The column loop as compiled launches run it, bounded by the runtime num_cols (interpreted
    launches bound it by a constant, ``kernel_constants``), gives the same result."""
    case = make_case(18, dtype, 2, 17, 40, 2, 1, 16)
    with_constant = segment_attention_triton(**case)
    monkeypatch.setattr(segment_attention_module, 'is_interpret_mode', lambda: False)
    try:
        with_runtime_bound = segment_attention_triton(**case)
    except Exception as error:      # Triton 3.6's interpreter: see kernel_constants
        if 'only 0-dimensional arrays' in str(error):
            pytest.skip(f'this Triton interpreter cannot bound a loop by a runtime int: {error}')
        raise
    assert torch.equal(with_runtime_bound, with_constant)
    assert_close(with_runtime_bound, segment_attention_ref(**case))


@needs_triton
def test_wrapper_runs_the_kernel_and_handles_empty_steps(interpret):
    case = make_case(13, torch.float64, 2, 3, 11, 4, 2, 16)
    via_kernel = segment_attention(**case)
    assert_close(via_kernel, segment_attention_ref(**case))
    # no columns: every row reads nothing, so zeros; no segments or rows: an empty result
    no_cols = dict(case, kv_index=case['kv_index'][:, :0], seg_mask=case['seg_mask'][..., :0])
    assert torch.equal(segment_attention(**no_cols), torch.zeros_like(case['q']))
    assert torch.equal(segment_attention_ref(**no_cols), torch.zeros_like(case['q']))
    no_rows = dict(case, q=case['q'][:0], seg_mask=case['seg_mask'][:, :0])
    assert segment_attention(**no_rows).shape == (0, 4, 16)
    no_segments = dict(case, q=case['q'][:0], kv_index=case['kv_index'][:0],
                       seg_mask=case['seg_mask'][:0])
    assert segment_attention(**no_segments).shape == (0, 4, 16)


def is_power_of_2(n):
    return n >= 1 and n & (n - 1) == 0


def test_default_launch_blocks():
    for num_rows in (1, 3, 17, 40, 64, 300):
        for num_cols in (1, 5, 64, 130):
            for dtype in (torch.bfloat16, torch.float16, torch.float32):    # tl.dot: >= 16
                block_m, block_n, block_d, num_warps = default_launch(num_rows, num_cols, 24,
                                                                      dtype)
                for block in (block_m, block_n, block_d):
                    assert block >= 16 and is_power_of_2(block)
                assert block_d == 32 and num_warps in (4, 8)
                assert block_m <= (64 if dtype.itemsize == 2 else 16) and block_n <= 64
                assert block_m * block_n <= 32 * 64
            for head_dim in (8, 24, 128, 512):     # float64: no tl.dot, a capped product tile
                block_m, block_n, block_d, num_warps = default_launch(num_rows, num_cols,
                                                                      head_dim, torch.float64)
                assert all(is_power_of_2(block) for block in (block_m, block_n, block_d))
                assert block_d == max(16, 1 << (head_dim - 1).bit_length())
                assert block_m <= min(16, 1 << (num_rows - 1).bit_length())
                assert block_n <= min(64, 1 << (num_cols - 1).bit_length())
                assert block_m * block_n * block_d <= FLOAT64_TILE and num_warps in (4, 8)
    # the 16-bit and float32 choices at the 7B shape (D = 128)
    assert default_launch(1, 300, 128, torch.bfloat16) == (16, 64, 128, 4)
    assert default_launch(64, 300, 128, torch.bfloat16) == (64, 32, 128, 8)
    assert default_launch(1, 300, 128, torch.float32) == (16, 32, 128, 4)
    assert default_launch(64, 300, 128, torch.float32) == (16, 32, 128, 4)
    # float64: a decode row keeps 32 columns, wider segments 2 x 16; small heads 16 x 16
    assert default_launch(1, 300, 128, torch.float64) == (1, 32, 128, 8)
    assert default_launch(64, 300, 128, torch.float64) == (2, 16, 128, 8)
    assert default_launch(40, 130, 16, torch.float64) == (16, 16, 16, 8)
    assert default_launch(3, 5, 16, torch.float64) == (4, 8, 16, 4)


# ---------------------------------------------------- (2b) CUDA compiles without a GPU (AOT)

COMPILE_CHECK = pathlib.Path(__file__).resolve().parents[1] / 'bench' / 'kernels_compile_check.py'


@needs_triton
def test_kernel_compiles_for_cuda_ahead_of_time():
    """Without a GPU: the kernel compiles for sm_90 (the CUDA tests' H100 / H200) down to a
    cubin at the default launches of float64, float32 and bf16, at the 7B head and small ones
    (``bench/kernels_compile_check.py``, which also covers sm_80). A float64 ``tl.dot`` failed
    here under Triton 3.6 ("Currently fp64 don't support largeK MMA")."""
    if not COMPILE_CHECK.exists():
        pytest.skip(f'{COMPILE_CHECK} is not part of this layout')
    env = {name: value for name, value in os.environ.items() if name != 'TRITON_INTERPRET'}
    result = subprocess.run([sys.executable, str(COMPILE_CHECK), '--targets', '90'],
                            capture_output=True, text=True, timeout=600, env=env)
    if result.returncode == 2:      # no CUDA backend in this Triton, or its ptxas cannot run
        pytest.skip(result.stdout.strip().splitlines()[-1])
    report = result.stdout + result.stderr[-3000:]
    assert result.returncode == 0, report
    lines = [line for line in result.stdout.splitlines() if ' sm_90 ' in line]
    assert lines and all(' ok ' in line for line in lines), report
    for dtype in ('float64', 'float32', 'bfloat16'):
        assert any(line.startswith(dtype) for line in lines), report


# ------------------------------------------------------------------------------------ (2c) CUDA

@needs_cuda
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize('num_rows', [1, 64])
def test_triton_on_cuda_7b_shape(monkeypatch, dtype, num_rows):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    case = make_case(14 + num_rows, dtype, 3, num_rows, 300, 32, 32, 128, device='cuda')
    actual, _ = run_both(case)
    if dtype == torch.bfloat16:
        # and against what the engine runs without the kernel: SDPA in bf16, which rounds
        # intermediates of its own, hence the doubled tolerance
        rtol, atol = TOLERANCES[dtype]
        torch.testing.assert_close(actual, gather_sdpa(**case), rtol=2 * rtol, atol=2 * atol)


@needs_cuda
def test_cuda_graph_replay_equals_eager(monkeypatch):
    """The launch (through the wrapper, index checks off) captures into a CUDA graph; a replay
    on new values written into the captured tensors equals an eager launch on them."""
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    shape = (3, 4, 300, 32, 32, 128)
    static = make_case(30, torch.bfloat16, *shape, device='cuda')
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # compile and warm up outside the capture
        segment_attention(**static, check_indices=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = segment_attention(**static, check_indices=False)
    fresh = make_case(31, torch.bfloat16, *shape, device='cuda')
    for name, x in fresh.items():
        static[name].copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    eager = segment_attention_triton(**fresh)
    assert torch.equal(captured, eager)
    assert_close(captured, segment_attention_ref(**fresh))


# ---------------------------------------------------------------- (3) wrapper validation errors

def _mismatched_heads(case):
    return torch.cat([case['k_cache'], case['k_cache'][:, :1]], dim=1)   # Hq=4, Hkv=3


BAD_INPUTS = [
    ('q', lambda c: c['q'][0], 'q must have 3 dims'),
    ('k_cache', lambda c: c['k_cache'][0], 'k_cache must have 3 dims'),
    ('kv_index', lambda c: c['kv_index'][0], 'kv_index must have 2 dims'),
    ('seg_mask', lambda c: c['seg_mask'][0], 'seg_mask must have 3 dims'),
    ('kv_index', lambda c: c['kv_index'].tolist(), 'kv_index must be a torch.Tensor'),
    ('q', lambda c: c['q'].long(), 'q must be a floating'),
    ('k_cache', lambda c: c['k_cache'].double(), 'k_cache dtype'),
    ('v_cache', lambda c: c['v_cache'].half(), 'v_cache dtype'),
    ('kv_index', lambda c: c['kv_index'].float(), 'kv_index must be int64 or int32'),
    ('kv_index', lambda c: c['kv_index'].short(), 'kv_index must be int64 or int32'),
    ('seg_mask', lambda c: c['seg_mask'].int(), 'seg_mask must be a bool'),
    ('seg_mask', lambda c: c['seg_mask'].to('meta'), 'seg_mask is on meta'),
    ('seg_mask', lambda c: c['seg_mask'][:-1], 'seg_mask shape'),
    ('seg_mask', lambda c: c['seg_mask'][..., :-1], 'seg_mask shape'),
    ('q', lambda c: c['q'][:-1], 'q has 14 rows'),
    ('q', lambda c: c['q'][..., :0], 'q head_dim must be > 0'),
    ('k_cache', lambda c: c['k_cache'][..., :-1], 'k_cache shape'),
    ('k_cache', _mismatched_heads, 'multiple of the k_cache heads'),
    ('v_cache', lambda c: c['v_cache'][:1], 'v_cache shape'),
    ('q', lambda c: torch.cat([c['q'], c['q']], -1)[..., ::2], 'q must have last-dim stride 1'),
    ('v_cache', lambda c: torch.cat([c['v_cache'], c['v_cache']], -1)[..., ::2],
     'v_cache must have last-dim stride 1'),
    ('kv_index', lambda c: c['kv_index'] + c['k_cache'].shape[0], 'kv_index values'),
    ('kv_index', lambda c: c['kv_index'] - c['kv_index'].max() - 1, 'kv_index values'),
    ('scale', lambda c: 0.0, 'scale'),
    ('scale', lambda c: float('nan'), 'scale'),
    ('scale', lambda c: '0.5', 'scale'),
]


@pytest.mark.parametrize('name, mutate, message', BAD_INPUTS)
@pytest.mark.parametrize('use_triton', [False, True])
def test_wrapper_rejects_bad_input(name, mutate, message, use_triton):
    case = make_case(15, torch.float32, 3, 5, 6, 4, 2, 8)
    case[name] = mutate(case)
    with pytest.raises(ValueError, match=message):
        segment_attention(**case, use_triton=use_triton)


def test_wrapper_reference_path_and_skipped_index_checks():
    case = make_case(16, torch.float64, 2, 3, 7, 4, 4, 16, index_dtype=torch.int32)
    expected = segment_attention_ref(**case)
    assert torch.equal(segment_attention(**case, use_triton=False), expected)
    assert torch.equal(segment_attention(**case, use_triton=False, check_indices=False),
                       expected)
    assert torch.equal(segment_attention(**case, scale=0.5, use_triton=False),
                       segment_attention_ref(**case, scale=0.5))
    # with check_indices=False a bad index is not looked at by the wrapper (torch fails later)
    bad = dict(case, kv_index=case['kv_index'] + 100)
    with pytest.raises(ValueError, match='kv_index values'):
        segment_attention(**bad, use_triton=False)
    with pytest.raises(IndexError):
        segment_attention(**bad, use_triton=False, check_indices=False)


def test_use_triton_without_gpu_or_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    case = make_case(17, torch.float32, 1, 2, 3, 2, 2, 16)
    with pytest.raises(ValueError, match='use_triton'):
        segment_attention(**case)
