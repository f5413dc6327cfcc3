"""KV slot copy for the unified ring: ring shift, slot remap and accepted-path compaction.

Contract (every implementation here): for each i, ``cache[dst_slots[i]] = OLD cache[src_slots[i]]``
for both k_cache and v_cache, i.e. all sources are read before any destination is written. That
makes overlapping moves correct: shifting a span left by a few slots inside the same ring
(ActionFlow's in-place shift that retires a finished request) or compacting the accepted draft
path [5, 9, 12] -> [3, 4, 5] after an EAGLE tree verify (slot 5 is both read and written).

Layout (llm.c ``dev/cuda`` style): ``kv_copy_ref`` (plain torch), ``kv_copy_triton`` (kernel
launches, no checks), ``kv_copy`` (validating wrapper), plus ``ring_shift_slots``, the
pure-Python index planner for a wrapped span.
"""
import torch

from ._triton_util import (HAS_TRITON, INDEX_DTYPES, LazyJit, check_can_launch,
                           check_index_values, check_tensor, next_power_of_2, tl)


def ring_shift_slots(start: int, length: int, shift: int, capacity: int):
    """(src, dst) lists that move the span of ``length`` slots beginning at ``start`` left by
    ``shift`` slots inside a ring of ``capacity`` slots (both spans may wrap around).

    Logical token i moves from slot (start + i) % capacity to (start - shift + i) % capacity.
    Sources and destinations may overlap; use with gather-then-write ``kv_copy``. A zero shift
    or empty span moves nothing and yields two empty lists.
    """
    for name, value in (('start', start), ('length', length), ('shift', shift),
                        ('capacity', capacity)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f'{name} must be an int, got {value!r}')
    if capacity < 1:
        raise ValueError(f'capacity must be >= 1, got {capacity}')
    if not 0 <= start < capacity:
        raise ValueError(f'start must lie in [0, {capacity}), got {start}')
    if not 0 <= length <= capacity:
        raise ValueError(f'length must lie in [0, {capacity}], got {length}')
    if not 0 <= shift < capacity:
        raise ValueError(f'shift must lie in [0, {capacity}), got {shift}')
    if shift == 0 or length == 0:
        return [], []
    src = [(start + i) % capacity for i in range(length)]
    dst = [(start - shift + i) % capacity for i in range(length)]
    return src, dst


def kv_copy_ref(k_cache, v_cache, src_slots, dst_slots):
    """Plain-torch reference; k_cache, v_cache: (S, Hkv, D) edited in place; slots: (n,) int."""
    src = src_slots.long()
    dst = dst_slots.long()
    # Advanced indexing returns copies, so every source row is read before any write below.
    k_rows = k_cache[src]  # (n, Hkv, D)
    v_rows = v_cache[src]  # (n, Hkv, D)
    k_cache[dst] = k_rows
    v_cache[dst] = v_rows


if HAS_TRITON:
    def _copy_rows_body(src_k_ptr, src_v_ptr, dst_k_ptr, dst_v_ptr, src_index_ptr, dst_index_ptr,
                        row_numel,
                        HAS_SRC_INDEX: tl.constexpr, HAS_DST_INDEX: tl.constexpr,
                        BLOCK: tl.constexpr):
        # Grid (n, cdiv(row_numel, BLOCK)): program (i, b) copies elements [b*BLOCK, (b+1)*BLOCK)
        # of row i for k and v. A row is one slot, Hkv * D contiguous elements. Row i is read at
        # src_index[i] (or i) and written at dst_index[i] (or i).
        i = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < row_numel
        src_row = i
        if HAS_SRC_INDEX:
            src_row = tl.load(src_index_ptr + i).to(tl.int64)
        dst_row = i
        if HAS_DST_INDEX:
            dst_row = tl.load(dst_index_ptr + i).to(tl.int64)
        src_off = src_row * row_numel + cols
        dst_off = dst_row * row_numel + cols
        tl.store(dst_k_ptr + dst_off, tl.load(src_k_ptr + src_off, mask=mask), mask=mask)
        tl.store(dst_v_ptr + dst_off, tl.load(src_v_ptr + src_off, mask=mask), mask=mask)

    _copy_rows_kernel = LazyJit(_copy_rows_body)


def default_block(row_numel: int) -> int:
    """Elements per program: the whole slot row up to 4096 (a power of two for tl.arange)."""
    return min(next_power_of_2(row_numel), 4096)


def kv_copy_triton(k_cache, v_cache, src_slots, dst_slots, *, block=None, num_warps=4):
    """Triton launch with the contract of ``kv_copy_ref``; inputs are NOT checked.

    Overlap safety by two phases through a scratch buffer: launch 1 gathers every source row
    into scratch, launch 2 scatters scratch into the destinations. Launches on one stream run
    in order, so no destination is written before every source has been read, whatever the
    overlap, and no ordering proof over the index sets is needed. The extra traffic is
    2 * n slot rows, small next to the forward pass for the few slots a shift or a compaction
    moves. Requires contiguous caches and index vectors (checked by ``kv_copy``).
    """
    num_rows = src_slots.shape[0]
    if num_rows == 0:
        return
    row_numel = k_cache[0].numel()
    if block is None:
        block = default_block(row_numel)
    scratch = torch.empty((2, num_rows) + tuple(k_cache.shape[1:]), dtype=k_cache.dtype,
                          device=k_cache.device)  # (2, n, Hkv, D): k rows, v rows
    grid = (num_rows, -(-row_numel // block))
    # phase 1: gather  scratch[i] = cache[src[i]]
    _copy_rows_kernel[grid](k_cache, v_cache, scratch[0], scratch[1], src_slots, src_slots,
                            row_numel, HAS_SRC_INDEX=True, HAS_DST_INDEX=False, BLOCK=block,
                            num_warps=num_warps)
    # phase 2: scatter  cache[dst[i]] = scratch[i]
    _copy_rows_kernel[grid](scratch[0], scratch[1], k_cache, v_cache, dst_slots, dst_slots,
                            row_numel, HAS_SRC_INDEX=False, HAS_DST_INDEX=True, BLOCK=block,
                            num_warps=num_warps)


def _as_index(name, slots, device):
    if isinstance(slots, torch.Tensor):
        return slots
    try:
        return torch.as_tensor(list(slots), dtype=torch.int64, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f'{name} must be a 1-D int tensor or a sequence of ints') from exc


def _check_args(k_cache, v_cache, src_slots, dst_slots):
    check_tensor('k_cache', k_cache, 3)
    check_tensor('v_cache', v_cache, 3)
    check_tensor('src_slots', src_slots, 1)
    check_tensor('dst_slots', dst_slots, 1)
    if not k_cache.dtype.is_floating_point:
        raise ValueError(f'k_cache must be a floating tensor, got {k_cache.dtype}')
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f'v_cache dtype {v_cache.dtype} differs from k_cache {k_cache.dtype}')
    if v_cache.shape != k_cache.shape:
        raise ValueError(f'v_cache shape {tuple(v_cache.shape)} must equal k_cache shape '
                         f'{tuple(k_cache.shape)}')
    for name, x in (('src_slots', src_slots), ('dst_slots', dst_slots)):
        if x.dtype not in INDEX_DTYPES:
            raise ValueError(f'{name} must be int64 or int32, got {x.dtype}')
        if not x.is_contiguous():
            raise ValueError(f'{name} must be contiguous')
    if dst_slots.shape != src_slots.shape:
        raise ValueError(f'dst_slots has {dst_slots.shape[0]} entries but src_slots has '
                         f'{src_slots.shape[0]}')
    for name, x in (('v_cache', v_cache), ('src_slots', src_slots), ('dst_slots', dst_slots)):
        if x.device != k_cache.device:
            raise ValueError(f'{name} is on {x.device} but k_cache is on {k_cache.device}')
    # The kernel copies a slot as one flat row of Hkv * D elements.
    for name, x in (('k_cache', k_cache), ('v_cache', v_cache)):
        if not x.is_contiguous():
            raise ValueError(f'{name} must be contiguous, got strides {x.stride()}')
    if k_cache.numel() and k_cache.data_ptr() == v_cache.data_ptr():
        raise ValueError('k_cache and v_cache must not share memory')


def kv_copy(k_cache, v_cache, src_slots, dst_slots, *, use_triton=False, check_indices=True):
    """Validated in-place slot copy ``cache[dst[i]] = OLD cache[src[i]]`` for k and v.

    k_cache, v_cache: (S, Hkv, D) contiguous; src_slots, dst_slots: (n,) int64/int32 tensors on
    the caches' device, or Python sequences of ints (e.g. from ``ring_shift_slots``). With
    ``check_indices`` (one device->host sync) slots must lie in [0, S) and dst_slots be unique;
    src_slots may repeat (one slot copied to several places). ``use_triton`` selects the kernel.
    """
    if isinstance(k_cache, torch.Tensor):
        src_slots = _as_index('src_slots', src_slots, k_cache.device)
        dst_slots = _as_index('dst_slots', dst_slots, k_cache.device)
    _check_args(k_cache, v_cache, src_slots, dst_slots)
    if check_indices:
        check_index_values('src_slots', src_slots, k_cache.shape[0], is_unique=False)
        check_index_values('dst_slots', dst_slots, k_cache.shape[0], is_unique=True)
    if use_triton:
        check_can_launch(k_cache.device)
        kv_copy_triton(k_cache, v_cache, src_slots, dst_slots)
    else:
        kv_copy_ref(k_cache, v_cache, src_slots, dst_slots)
