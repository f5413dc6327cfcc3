"""Host side of one packed forward: requests' rows -> flat index arrays (numpy, no torch).

A packed forward carries any number of prefills (fresh requests' causal prompts, no history;
usually none or one, several when several streams have a frame waiting) and any number of
*segments*: one per in-flight request, each a few rows (a decode token, an
EAGLE draft tree, a chain of accepted tokens, a draft level) that attend to their own
request's KV only. That is what makes the step's attention proportional to the work in flight
instead of to the whole ring: the device gathers, per segment, just the ``num_cols`` slots of
its own request (``kv_index``) and attends with a small (rows x cols) mask built here.

Layout of the packed token axis (T = num_prefill + num_segments * num_rows):

    [prefill 0][prefill 1] ... [segment 0: num_rows rows][segment 1] ... [segment S-1]

``prefill_blocks`` holds the row count of each prefill block (num_prefill is their sum); a
block attends to its own rows only and may be padded at its end. It attends causally, except
that a prefix-LM model's prompt (``PrefillRows.num_bidirectional``: images and text of a
pi0-FAST frame) is read by every row of the block: the extra ``prefill_prefix`` (one entry per
block) carries it to the device, where ``models/attention.prefill_allowed`` applies the rule.
The padding rows at a block's end lie past its prefix, so the mask (not causality alone) keeps
every real row blind to them; drafted chain rows after the prompt stay causal.

Every segment is padded to ``num_rows`` rows and ``num_cols`` gathered slots, and the number
of segments may be padded too (CUDA graphs replay fixed shapes). Padding rows write their K/V
to ``scratch_slot`` (a slot no request owns) and attend to column 0 only, so they can neither
produce NaN nor touch a request's KV. ``moves`` (KV compaction of accepted tree paths) are
padded with scratch -> scratch copies.

Terms. A request's logical index i lives in physical slot ``(base + i) % modulus`` (the ring
wraps; drafter lanes never do). ``num_visible`` = logical slots 0 .. num_visible-1 every row of
the segment may read (its history); ``tree_start`` / ``tree_mask`` = the further logical slots
a row may read: its tree ancestors and itself (a causal chain is a tree whose node i has parent
i - 1). ``ancestor_mask`` is the one builder of that tree attention rule, for the verifier's
trees and the drafter's tree levels alike. Positions are logical RoPE positions, never
physical.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from ..tree_nodes import NO_PARENT


@dataclass(frozen=True)
class PrefillRows:
    """A fresh request's prompt of ``prompt_len`` rows (the caller brings their embeddings),
    optionally followed by a drafted ``chain`` of token ids (speculative prefill): causal rows
    at logical slots / positions 0 .. length-1. The greedy tokens of the prompt's last row and
    of every chain row are read back (``num_read``): the first decides the request's first
    action token, each one after verifies the chain token before it."""

    base: int
    modulus: int
    prompt_len: int
    chain: tuple[int, ...] = ()
    # The prompt's first rows every row of the block reads (a bidirectional prefix; 0 =
    # causal). At most ``prompt_len``: chain rows are always causal.
    num_bidirectional: int = 0

    def __post_init__(self):
        if not 0 <= self.num_bidirectional <= self.prompt_len:
            raise ValueError(f'num_bidirectional: {self.num_bidirectional} outside 0 .. '
                             f'prompt_len {self.prompt_len}')

    @property
    def length(self) -> int:
        return self.prompt_len + len(self.chain)

    @property
    def num_read(self) -> int:
        return 1 + len(self.chain)


@dataclass(frozen=True, eq=False)
class SegmentRows:
    """One request's rows in a packed forward (see the module docstring for the terms)."""

    base: int
    modulus: int
    num_visible: int
    slots: tuple[int, ...]          # logical slot each row writes its K/V to
    positions: tuple[int, ...]      # logical RoPE position of each row
    tokens: tuple[int, ...]         # input token id of each row
    tree_start: int                 # logical slot of tree node 0 (node k at tree_start + k)
    tree_mask: np.ndarray           # (rows, nodes) bool: row j may also read tree node k

    @property
    def num_rows(self) -> int:
        return len(self.slots)

    @cached_property
    def num_cols(self) -> int:
        """Logical slots 0 .. num_cols-1 cover everything any row reads or writes."""
        return max([self.num_visible] + [s + 1 for s in self.slots])


def ancestor_mask(parents: Sequence[int]) -> np.ndarray:
    """The tree attention rule: (n, n) bool, ``mask[i, j]`` iff node j is node i or one of its
    ancestors (EAGLE tree attention). The one builder of every tree mask in the engine.

    ``parents[0] == NO_PARENT`` (node 0 is the root) and ``0 <= parents[i] < i`` otherwise.
    The array is read-only (shared between calls with the same parents).
    """
    return _tree_structure(tuple(parents))[0]


@lru_cache(maxsize=256)             # decode tokens and chains repeat every step
def _tree_structure(parents: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """(ancestor mask, depths) of a tree given by its parents (see ``ancestor_mask``)."""
    n = len(parents)
    if n == 0 or parents[0] != NO_PARENT:
        raise ValueError(f'parents: a tree needs parents[0] == {NO_PARENT}, got {list(parents)}')
    ancestry = [(0,)]               # node i: its ancestors and itself, root first
    for node in range(1, n):
        parent = parents[node]
        if not 0 <= parent < node:
            raise ValueError(f'parents: node {node} has parent {parent}; parents must precede '
                             'their children')
        ancestry.append(ancestry[parent] + (node,))
    counts = [len(a) for a in ancestry]
    mask = np.zeros((n, n), dtype=np.bool_)
    mask[np.repeat(np.arange(n), counts),
         np.fromiter((j for a in ancestry for j in a), dtype=np.int64, count=sum(counts))] = True
    mask.setflags(write=False)
    return mask, tuple(c - 1 for c in counts)


def tree_rows(base: int, modulus: int, history_len: int, parents: Sequence[int],
              tokens: Sequence[int], rows: Sequence[int] | None = None) -> SegmentRows:
    """A draft tree (or, with parents -1, 0, 1, ..., a causal chain) after ``history_len`` KV
    entries: node i writes logical slot history_len + i, sits at position history_len +
    depth(i) and reads the history, its ancestors and itself (EAGLE tree attention).

    ``rows`` (default: every node) are the nodes fed in this forward, in row order; the other
    nodes' K/V must already be at their slots (the drafter grows its trees a level per
    forward). ``tokens`` has one entry per node.
    """
    if len(parents) != len(tokens):
        raise ValueError(f'parents: one parent per token needed, got {list(parents)} for '
                         f'{len(tokens)} tokens')
    mask, depths = _tree_structure(tuple(parents))
    if rows is None:
        rows = range(len(parents))
    else:
        rows = [int(r) for r in rows]
        mask = mask[rows]
    return SegmentRows(base, modulus, history_len,
                       slots=tuple(history_len + r for r in rows),
                       positions=tuple(history_len + depths[r] for r in rows),
                       tokens=tuple(int(tokens[r]) for r in rows),
                       tree_start=history_len, tree_mask=mask)


def chain_rows(base: int, modulus: int, history_len: int, tokens: Sequence[int]) -> SegmentRows:
    """Causal rows: ``tokens`` fed at logical slots / positions history_len, history_len+1..."""
    return tree_rows(base, modulus, history_len, [NO_PARENT] + list(range(len(tokens) - 1)),
                     tokens)


@dataclass
class HostStep:
    """Flat index arrays of one packed forward (int64 unless noted); S, Q, K, M as padded.

    token_ids (S*Q,)     input token of each segment row (the prefill brings embeddings)
    positions (T,)       RoPE position of each packed row
    slot_mapping (T,)    physical slot each row's K/V is written to
    kv_index (S, K)      physical slots each segment gathers (logical 0 .. K-1, then scratch)
    mask (S, Q, K) bool  row j of segment s may read gathered column k
    copy_src/dst (M,)    KV compaction applied at the start of every layer, before any write
    extras               further named int64 arrays of the caller (e.g. feature row indices)
    """

    prefill_blocks: tuple[int, ...]
    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    kv_index: np.ndarray
    mask: np.ndarray
    copy_src: np.ndarray
    copy_dst: np.ndarray
    extras: dict

    @property
    def num_prefill(self) -> int:
        """Rows of all prefill blocks together (padding included)."""
        return sum(self.prefill_blocks)

    @property
    def num_segments(self) -> int:
        return self.kv_index.shape[0]

    @property
    def num_rows(self) -> int:
        return self.mask.shape[1]

    @property
    def key(self) -> tuple:
        """Everything the device-side shapes depend on (a CUDA graph bucket)."""
        return (self.prefill_blocks, *self.mask.shape, self.copy_src.shape[0],
                tuple((name, a.shape[0]) for name, a in self.extras.items()))

    @property
    def reads_per_prefill(self) -> int:
        """Greedy tokens read back per prefill block (``prefill_read`` holds that many rows
        per block, a block's own reads first, then its last read repeated as padding)."""
        if not self.prefill_blocks:
            return 0
        return self.extras['prefill_read'].shape[0] // len(self.prefill_blocks)

    def int_arrays(self) -> list[tuple[str, np.ndarray]]:
        """The int64 arrays in upload order (the mask travels after them as bytes)."""
        return [('token_ids', self.token_ids), ('positions', self.positions),
                ('slot_mapping', self.slot_mapping), ('kv_index', self.kv_index.ravel()),
                ('copy_src', self.copy_src), ('copy_dst', self.copy_dst),
                *[(name, a) for name, a in self.extras.items()]]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): a shape bucket."""
    return 1 << max(0, n - 1).bit_length()


def power_of_two_buckets(n: int) -> list[int]:
    """Every power-of-two bucket a count of 1 .. n falls in: 1, 2, 4, .. next_power_of_two(n)."""
    return [1 << i for i in range(next_power_of_two(n).bit_length())]


def pack_step(prefills: Sequence[PrefillRows], segments: Sequence[SegmentRows],
              scratch_slot: int, num_segments: int | None = None, num_rows: int | None = None,
              num_cols: int | None = None, moves: Sequence[tuple[int, int]] = (),
              num_moves: int | None = None, extras: dict | None = None,
              prefill_rows: int | None = None,
              chain_per_prefill: int | None = None) -> HostStep:
    """Lay ``prefills`` and ``segments`` end to end; pad to the given sizes (default: tight).

    ``prefill_rows`` >= every prefill's length pads each prefill block to that many rows at
    its end: causal attention keeps the real rows blind to the padding rows, which write to
    the scratch slot. A bidirectional prefix (``num_bidirectional``, any prefill) adds the
    extra ``prefill_prefix`` (one entry per block; the padding rows lie past it, so the
    prefix's rows never read them either).

    Drafted chains (speculative prefill): the extras ``prefill_chain_ids`` /
    ``prefill_chain_rows`` say which token's embedding each chain row takes (the device writes
    them over the block's input rows). Tight (``chain_per_prefill`` None) they list the real
    chain rows only; with ``chain_per_prefill`` (fixed shapes for CUDA graphs) every block
    has that many entries, the ones past its chain naming token 0 on its padding rows (which
    write the scratch slot). Per prefill, 1 + the longest chain (or ``chain_per_prefill``)
    entries of ``prefill_read`` name the rows whose greedy tokens are read back: the prompt's
    last row and the chain rows, then the last real row repeated as padding.
    """
    prefills, segments = list(prefills), list(segments)
    # 1. the padded sizes, checked against what they must hold
    q = max([s.num_rows for s in segments], default=1) if num_rows is None else num_rows
    k = max([s.num_cols for s in segments], default=1) if num_cols is None else num_cols
    num_s = len(segments) if num_segments is None else num_segments
    num_m = len(moves) if num_moves is None else num_moves
    if len(segments) > num_s or len(moves) > num_m or q < 1 or k < 1:
        raise ValueError(f'pack_step: {len(segments)} segments / {len(moves)} moves do not fit '
                         f'the padded sizes {num_s} / {num_m} (rows {q}, cols {k})')
    num_chain = _chain_entries(prefills, chain_per_prefill)
    lengths = [p.length for p in prefills]
    if prefill_rows is not None and any(n > prefill_rows for n in lengths):
        raise ValueError(f'pack_step: prefill_rows {prefill_rows} < a prefill length '
                         f'{max(lengths)}')
    blocks = tuple(lengths if prefill_rows is None else [prefill_rows] * len(prefills))
    lp = sum(blocks)
    # 2. every row writes the scratch slot at position 0 unless a prefill or segment owns it
    positions = np.zeros(lp + num_s * q, dtype=np.int64)
    slot_mapping = np.full(lp + num_s * q, scratch_slot, dtype=np.int64)
    # 3. the prefill blocks, then 4. the segments after them
    prefill_extras = _place_prefills(prefills, blocks, num_chain, chain_per_prefill, positions,
                                     slot_mapping)
    token_ids, kv_index, mask = _place_segments(segments, lp, num_s, q, k, scratch_slot,
                                                positions, slot_mapping)
    # 5. the compaction moves, padded with scratch -> scratch copies
    copy_src = np.full(num_m, scratch_slot, dtype=np.int64)
    copy_dst = np.full(num_m, scratch_slot, dtype=np.int64)
    if moves:
        copy_src[:len(moves)], copy_dst[:len(moves)] = zip(*moves)
    extras = {name: np.asarray(a, dtype=np.int64) for name, a in extras.items()} \
        if extras else {}
    extras.update(prefill_extras)
    return HostStep(blocks, token_ids, positions, slot_mapping, kv_index, mask, copy_src,
                    copy_dst, extras)


def _chain_entries(prefills: list[PrefillRows], chain_per_prefill: int | None) -> int:
    """Chain entries per prefill block: tight (None), as many as the longest chain; else
    ``chain_per_prefill``, which every chain must fit."""
    if chain_per_prefill is None:
        return max([len(p.chain) for p in prefills], default=0)
    if any(len(p.chain) > chain_per_prefill for p in prefills):
        raise ValueError(f'pack_step: chain_per_prefill {chain_per_prefill} < a prefill\'s '
                         'chain')
    return chain_per_prefill


def _place_prefills(prefills: list[PrefillRows], blocks: tuple[int, ...], num_chain: int,
                    chain_per_prefill: int | None, positions: np.ndarray,
                    slot_mapping: np.ndarray) -> dict:
    """Writes each prefill's positions and ring slots into its block (rows 0 .. lp-1 of
    ``positions`` / ``slot_mapping``); returns the prefill extras (``pack_step``'s docstring):
    the rows read back, the bidirectional prefixes, the chain rows and their tokens."""
    prefill_read, chain_ids, chain_rows, start = [], [], [], 0
    for prefill, block in zip(prefills, blocks):
        length = prefill.length
        logical = np.arange(length)
        positions[start:start + length] = logical
        logical += prefill.base
        logical %= prefill.modulus
        slot_mapping[start:start + length] = logical
        last = start + length - 1
        prefill_read += range(last - prefill.num_read + 1, last + 1)
        prefill_read += [last] * (num_chain + 1 - prefill.num_read)
        entries = len(prefill.chain) if chain_per_prefill is None else chain_per_prefill
        if prefill.prompt_len + entries > block:
            raise ValueError(f'pack_step: a prefill block of {block} rows has no room for '
                             f'{entries} chain rows after its {prefill.prompt_len}-row prompt')
        chain_ids += prefill.chain
        chain_ids += [0] * (entries - len(prefill.chain))
        chain_rows += range(start + prefill.prompt_len, start + prefill.prompt_len + entries)
        start += block
    extras = {}
    if prefills:
        extras['prefill_read'] = np.array(prefill_read, dtype=np.int64)
        if any(p.num_bidirectional for p in prefills):
            extras['prefill_prefix'] = np.array([p.num_bidirectional for p in prefills],
                                                dtype=np.int64)
        if chain_ids:
            extras['prefill_chain_ids'] = np.array(chain_ids, dtype=np.int64)
            extras['prefill_chain_rows'] = np.array(chain_rows, dtype=np.int64)
    return extras


def _place_segments(segments: list[SegmentRows], lp: int, num_s: int, q: int, k: int,
                    scratch_slot: int, positions: np.ndarray, slot_mapping: np.ndarray):
    """Writes each segment's positions and ring slots after the prefill rows (segment s at
    rows lp + s * q ..); -> (token_ids (S*Q,), kv_index (S, K), mask (S, Q, K)). Padding rows
    and padding segments read column 0 only (never NaN) and gather the scratch slot."""
    token_ids = np.zeros(num_s * q, dtype=np.int64)
    kv_index = np.full((num_s, k), scratch_slot, dtype=np.int64)
    mask = np.zeros((num_s, q, k), dtype=np.bool_)
    if num_s > len(segments):
        mask[len(segments):, :, 0] = True
    for s, seg in enumerate(segments):
        n, cols, base, modulus = seg.num_rows, seg.num_cols, seg.base, seg.modulus
        if n > q or cols > k:
            raise ValueError(f'pack_step: a segment of {n} rows x {cols} slots exceeds the '
                             f'padded {q} x {k}')
        kv_index[s, :cols] = np.arange(base, base + cols) % modulus
        r0 = lp + s * q
        positions[r0:r0 + n] = seg.positions
        slot_mapping[r0:r0 + n] = [(base + slot) % modulus for slot in seg.slots]
        token_ids[s * q:s * q + n] = seg.tokens
        rows = mask[s]                          # (q, k) view
        rows[n:, 0] = True
        rows[:n, :seg.num_visible] = True
        t0 = seg.tree_start
        rows[:n, t0:t0 + seg.tree_mask.shape[1]] |= seg.tree_mask
    return token_ids, kv_index, mask


def padding_step(prefill_blocks: Sequence[int], num_segments: int, num_rows: int,
                 num_cols: int, num_moves: int, scratch_slot: int,
                 chain_per_prefill: int = 0, has_prefix: bool = False) -> HostStep:
    """A step of the given padded shape made only of padding rows: every row writes to and
    reads from the scratch slot, moves copy scratch onto itself. Running it changes no
    request's KV, so it can build (capture) a shape bucket before real work needs it.
    ``has_prefix``: the bucket of a bidirectional-prefix model (a zero ``prefill_prefix``
    per block, the array a real step of that model uploads)."""
    step = pack_step([], [], scratch_slot, num_segments=num_segments, num_rows=num_rows,
                     num_cols=num_cols, num_moves=num_moves)
    prefill_blocks = tuple(int(n) for n in prefill_blocks)
    if prefill_blocks:
        lp = sum(prefill_blocks)
        step.positions = np.concatenate([np.zeros(lp, dtype=np.int64), step.positions])
        step.slot_mapping = np.concatenate([np.full(lp, scratch_slot, np.int64),
                                            step.slot_mapping])
        step.prefill_blocks = prefill_blocks
        num = len(prefill_blocks)
        step.extras['prefill_read'] = np.zeros(num * (1 + chain_per_prefill), dtype=np.int64)
        if has_prefix:
            step.extras['prefill_prefix'] = np.zeros(num, dtype=np.int64)
        if chain_per_prefill:
            starts = np.cumsum((0,) + prefill_blocks[:-1])
            step.extras['prefill_chain_ids'] = np.zeros(num * chain_per_prefill, np.int64)
            step.extras['prefill_chain_rows'] = (starts[:, None] + np.arange(
                chain_per_prefill)).ravel().astype(np.int64)
    return step
