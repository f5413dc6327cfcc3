"""Device side of a packed forward: one upload per step, static buffers, CUDA graphs.

``PackedForward`` turns a ``HostStep`` (engine/device/step_inputs.py) into device tensors and runs
a model function on them. Per shape bucket (``HostStep.key`` plus the shapes of the dense inputs)
it keeps:
- one pinned host byte buffer and one device byte buffer holding every index array and the
  mask: filling the host buffer is numpy work, and the whole step's metadata reaches the
  device in ONE non-blocking copy; the ``StepBatch`` views into the device buffer are built
  once per bucket and reused (their addresses never change, which is what a graph needs);
- with ``use_cuda_graphs`` on a CUDA device, a CUDA graph of the model function captured on
  the bucket's first use (that first call runs eagerly, which is also the warm-up) and
  replayed afterwards; dense inputs (embeddings, features) are copied into static tensors.

On CPU the host buffer is the device buffer (no copy) and the function always runs eagerly,
through exactly the same views: the static-buffer path that graphs replay is the path every
CPU test exercises. Nothing here knows which model runs; the verifier runner and the drafter
each own one ``PackedForward``.
"""
from __future__ import annotations

import functools
import gc
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...models.attention import StepBatch
from .step_inputs import HostStep

MAX_BUCKETS = 64        # eager buckets kept (graph buckets are kept for the engine's life)

StepFn = Callable[..., dict]    # fn(batch, ints, dense, **params) -> outputs


def inference_mode(fn):
    """``torch.inference_mode()`` as a decorator that costs nothing when it is already on:
    the engine's step enters it once, and the draft and forward calls nested in it run
    several times a step (the decorator's context manager is a measurable share of a small
    model's step on a CPU)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


@dataclass
class _Bucket:
    host: torch.Tensor                    # uint8, pinned on CUDA; the device buffer on CPU
    device: torch.Tensor
    batch: StepBatch
    ints: dict                            # name -> int64 view into ``device``
    offsets: list                         # (name, start, count) of each int array
    mask_start: int
    host_ints: np.ndarray                 # int64 numpy view of ``host`` (the int arrays)
    host_mask: np.ndarray                 # uint8 numpy view of ``host`` (the mask)
    graph: 'GraphedFunction | None' = None


class PackedForward:
    def __init__(self, fn: StepFn, device, use_cuda_graphs: bool = False):
        self.fn = fn
        self.device = torch.device(device)
        self.is_cuda = self.device.type == 'cuda'
        if use_cuda_graphs and not self.is_cuda:
            raise ValueError(f'use_cuda_graphs: CUDA graphs need a CUDA device, got '
                             f'{self.device}')
        self.use_cuda_graphs = bool(use_cuda_graphs)
        self._buckets: OrderedDict[tuple, _Bucket] = OrderedDict()
        self._pool = None

    @inference_mode
    def __call__(self, step: HostStep, dense: dict | None = None,
                 params: dict | None = None) -> dict:
        """Upload ``step``, run ``fn(batch, ints, dense, **params)``; returns its outputs
        (static in graph mode: read or copy them before the next call of the same bucket).
        ``params`` are plain values the function's shapes depend on (part of the bucket)."""
        dense, params = dense or {}, params or {}
        key = self.bucket_key(step, dense, params)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._new_bucket(step)
            self._buckets[key] = bucket
            if not self.use_cuda_graphs and len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        self._upload(bucket, step)
        if not self.use_cuda_graphs:
            return self.fn(bucket.batch, bucket.ints, dense, **params)
        if bucket.graph is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            bucket.graph = GraphedFunction(
                lambda inputs, b=bucket: self.fn(b.batch, b.ints, inputs, **params),
                self.device, self._pool)
        return bucket.graph(dense)

    @staticmethod
    def bucket_key(step: HostStep, dense: dict | None = None, params: dict | None = None):
        """Everything the shapes of one call depend on: the step's padded sizes, the dense
        inputs' shapes and dtypes, the params. One bucket (and one graph) per key."""
        return (step.key + tuple((name, tuple(t.shape), t.dtype)
                                 for name, t in (dense or {}).items())
                + tuple(sorted((params or {}).items())))

    def has_bucket(self, step: HostStep, dense: dict | None = None,
                   params: dict | None = None) -> bool:
        """Whether a call with these inputs would reuse a bucket (replay a graph)."""
        return self.bucket_key(step, dense, params) in self._buckets

    @property
    def num_graph_replays(self) -> int:
        return sum(b.graph.num_replays for b in self._buckets.values() if b.graph)

    @property
    def num_graph_captures(self) -> int:
        return sum(1 for b in self._buckets.values() if b.graph and b.graph.is_captured)

    # ---- buffers ------------------------------------------------------------------------------

    def _new_bucket(self, step: HostStep) -> _Bucket:
        offsets, start = [], 0
        for name, array in step.int_arrays():
            offsets.append((name, start, array.size))
            start += array.size
        mask_start = start * 8
        nbytes = mask_start + step.mask.size
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.is_cuda)
        device = torch.empty(nbytes, dtype=torch.uint8, device=self.device) \
            if self.is_cuda else host
        ints64 = device[:mask_start].view(torch.int64)
        ints = {name: ints64[a:a + n] for name, a, n in offsets}
        mask = device[mask_start:].view(torch.bool).view(step.mask.shape)
        num_s = step.num_segments
        batch = StepBatch(positions=ints['positions'], slot_mapping=ints['slot_mapping'],
                          prefill_blocks=step.prefill_blocks,
                          kv_index=ints['kv_index'].view(num_s, -1) if num_s else None,
                          seg_mask=mask if num_s else None,
                          copy_src=ints['copy_src'] if step.copy_src.size else None,
                          copy_dst=ints['copy_dst'] if step.copy_src.size else None,
                          prefill_prefix=ints.get('prefill_prefix'))
        host_np = host.numpy()
        return _Bucket(host, device, batch, ints, offsets, mask_start,
                       host_np[:mask_start].view(np.int64), host_np[mask_start:])

    def _upload(self, bucket: _Bucket, step: HostStep) -> None:
        ints64 = bucket.host_ints
        for (name, start, count), (_, array) in zip(bucket.offsets, step.int_arrays()):
            ints64[start:start + count] = array.ravel()
        bucket.host_mask[:] = step.mask.ravel().view(np.uint8)
        if self.is_cuda:
            # One copy per step; non-blocking from pinned memory (the stream orders it before
            # the forward that reads it). The host buffer is rewritten only on the next call of
            # this bucket, after the greedy tokens of this call were read (a sync point).
            bucket.device.copy_(bucket.host, non_blocking=True)

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)


class GraphedFunction:
    """``fn(inputs) -> dict of tensors`` as one CUDA graph over static input tensors.

    The first call runs ``fn`` eagerly (the real work and the warm-up: kernels compiled,
    handles created), synchronises, then captures; capturing records kernels without running
    them, so side effects (KV writes) happen once. The synchronisation leaves the caching
    allocator no pending cross-stream events to query while the capture runs, and garbage
    collection is done before and paused during the capture (a CUDA call from either
    invalidates the capture; seen with several engines alive in one process). Later calls
    copy ``inputs`` into the static tensors and replay; their outputs are the graph's static
    tensors, overwritten by the next replay.
    """

    def __init__(self, fn: Callable[[dict], dict], device, pool=None):
        self.fn = fn
        self.device = torch.device(device)
        self.pool = pool
        self.static_inputs: dict = {}
        self.outputs: dict = {}
        self.graph = None
        self.num_replays = 0

    @property
    def is_captured(self) -> bool:
        return self.graph is not None

    @inference_mode
    def __call__(self, inputs: dict) -> dict:
        # Always under inference mode: static tensors made in it are inference tensors, and
        # an in-place copy into one outside it is refused (a graph captured inside a step,
        # then replayed from ``Engine.capture_graphs`` outside it, failed that way).
        if self.graph is not None:
            for name, tensor in inputs.items():
                self.static_inputs[name].copy_(tensor)
            self.graph.replay()
            self.num_replays += 1
            return self.outputs
        self.static_inputs = {name: t.clone() for name, t in inputs.items()}
        eager = {name: t.clone() for name, t in self.fn(self.static_inputs).items()}
        # Python's collector must not run inside the capture: destroying an unreachable
        # engine's graphs or event-guarded blocks there is a CUDA call that invalidates it.
        gc.collect()
        torch.cuda.synchronize(self.device)
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs = self.fn(self.static_inputs)
        finally:
            if was_enabled:
                gc.enable()
        self.graph = graph
        return eager
