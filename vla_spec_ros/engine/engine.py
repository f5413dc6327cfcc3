"""The streaming engine: submit frames, step, collect finished actions.

This is the public interface the ROS node and ``VLAPolicy.predict`` use. Input is validated at
``submit`` (image, instruction, ``unnorm_key``) so bad input raises there and never enters a
packed step. ``step()`` runs one unit of work for the configured mode: in "ar" one whole request
(the S1 reference), in the pipelined / speculative modes one packed forward. Failures inside a
step are reported as ``FinishedAction.error`` for the requests they hit, never raised, so a
serving loop keeps running.
"""
from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ..actions import ActionStats, resolve_unnorm_key
from ..config import TUNABLE_ENGINE_FIELDS, EngineConfig
from ..preprocess import check_image
from .ar import decode_ar
from .result import ActionResult, FinishedAction, Frame
from .runner import ModelRunner


@dataclass
class Request:
    """One frame's decoding state (host side)."""

    request_id: int
    frame: Frame
    input_ids: list[int]
    unnorm_key: str
    submit_time: float
    tokens: list[int] = field(default_factory=list)
    forward_passes: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    start_time: float | None = None


class Engine:
    def __init__(self, runner: ModelRunner, norm_stats: dict, config: EngineConfig,
                 draft=None):
        self.runner = runner
        self.norm_stats = norm_stats
        self._config = config
        self._draft = draft
        self._stats = {key: ActionStats.from_norm_stats(entry, key)
                       for key, entry in norm_stats.items()}
        self._ids = itertools.count()
        self._waiting: collections.deque[Request] = collections.deque()
        self.num_verifier_forwards = 0   # packed verifier forwards run so far (stats)
        # The runner may be shared by several engines (bench, tests): each engine installs its
        # own kernel choice at the start of every step.
        self._kernel = select_rope_kernel(config, runner.device)
        self._strategy = self._make_strategy(config)

    # ---- configuration ----------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        return self._config

    def set_tunables(self, **changes) -> None:
        """Change relax_threshold / tree sizes between frames (validated; no reload)."""
        bad = sorted(set(changes) - set(TUNABLE_ENGINE_FIELDS))
        if bad:
            raise ValueError(f'{bad} cannot change at run time; tunables are '
                             f'{list(TUNABLE_ENGINE_FIELDS)}')
        self._config = self._config.replace(**changes)
        if self._strategy is not None:
            self._strategy.config_changed(self._config)

    def _make_strategy(self, config: EngineConfig):
        if config.mode == 'ar':
            return None
        from .strategies import make_strategy   # pipelined / speculative modes
        return make_strategy(self, config)

    # ---- submission ---------------------------------------------------------------------------

    def submit(self, frame: Frame) -> int:
        """Validate and enqueue a frame; raises ValueError on bad input (nothing is queued)."""
        check_image(frame.image)
        input_ids = self.runner.validate_instruction(frame.instruction)
        key = resolve_unnorm_key(self.norm_stats, frame.unnorm_key)
        longest = (self.runner.prefix_len(input_ids) + self.runner.action_dim
                   + self._config.tree_depth)
        if longest > self.runner.cfg.llm.max_position_embeddings:
            raise ValueError(f'prompt needs {longest} positions; the model has '
                             f'{self.runner.cfg.llm.max_position_embeddings}')
        request = Request(next(self._ids), frame, input_ids, key, time.perf_counter())
        if self._strategy is not None:
            self._strategy.submit(request)
        else:
            self._waiting.append(request)
        return request.request_id

    def has_work(self) -> bool:
        if self._strategy is not None:
            return self._strategy.has_work()
        return bool(self._waiting)

    def has_waiting(self) -> bool:
        """True while a submitted frame has not started (its prefill is not done)."""
        if self._strategy is not None:
            return self._strategy.has_waiting()
        return bool(self._waiting)

    def drop_waiting(self, stream_id: str) -> list[int]:
        """Drop frames of ``stream_id`` not yet started (a newer frame replaces them)."""
        if self._strategy is not None:
            return self._strategy.drop_waiting(stream_id)
        dropped = [r.request_id for r in self._waiting if r.frame.stream_id == stream_id]
        self._waiting = collections.deque(r for r in self._waiting
                                          if r.frame.stream_id != stream_id)
        return dropped

    def reset(self, stream_id: str | None = None) -> list[int]:
        """Drop waiting and in-flight requests (of one stream, or all)."""
        if self._strategy is not None:
            return self._strategy.reset(stream_id)
        dropped = [r.request_id for r in self._waiting
                   if stream_id is None or r.frame.stream_id == stream_id]
        self._waiting = collections.deque(r for r in self._waiting
                                          if r.request_id not in dropped)
        return dropped

    # ---- stepping -----------------------------------------------------------------------------

    def step(self) -> list[FinishedAction]:
        self.runner.kernel = self._kernel
        if self._strategy is not None:
            try:
                return self._strategy.step()
            except Exception as exc:   # report to every affected request; keep serving
                victims = self._strategy.abort_all()
                return [FinishedAction(r.request_id, r.frame, None, _describe(exc))
                        for r in victims]
        if not self._waiting:
            return []
        request = self._waiting.popleft()
        try:
            request.start_time = time.perf_counter()
            prompt = self.runner.prepare_prompt(request.frame, self._config, request.input_ids)
            tokens, forwards = decode_ar(self.runner, prompt.embeds, self.runner.action_dim,
                                         self._config.restrict_to_action_tokens)
            request.tokens = tokens
            request.forward_passes = forwards
            self.num_verifier_forwards += forwards
            request.accepted_lengths = [1] * len(tokens)
            return [self.finish(request)]
        except Exception as exc:
            return [FinishedAction(request.request_id, request.frame, None, _describe(exc))]

    def run_until_idle(self, max_steps: int = 100000) -> list[FinishedAction]:
        out: list[FinishedAction] = []
        for _ in range(max_steps):
            if not self.has_work():
                return out
            out.extend(self.step())
        raise RuntimeError(f'engine still busy after {max_steps} steps')

    def finish(self, request: Request) -> FinishedAction:
        """Tokens -> ActionResult (de-tokenise, un-normalise, validity check)."""
        decoded = self.runner.action_tokenizer.decode(request.tokens)
        stats = self._stats[request.unnorm_key]
        action = stats.unnormalize(np.nan_to_num(decoded.normalized, nan=0.0))
        is_valid, reason = decoded.is_valid, decoded.invalid_reason
        if is_valid and not np.all(np.isfinite(action)):
            is_valid, reason = False, f'non-finite action {action.tolist()}'
        if not is_valid:
            action = np.full_like(action, np.nan)
        now = time.perf_counter()
        result = ActionResult(
            tokens=tuple(int(t) for t in request.tokens), normalized=decoded.normalized,
            action=action, is_valid=is_valid, invalid_reason=reason,
            stats={'mode': self._config.mode, 'forward_passes': request.forward_passes,
                   'accepted_lengths': list(request.accepted_lengths),
                   'latency_s': now - request.submit_time,
                   'compute_s': now - (request.start_time or request.submit_time),
                   'unnorm_key': request.unnorm_key})
        return FinishedAction(request.request_id, request.frame, result, None)


def select_rope_kernel(config: EngineConfig, device):
    """The fused RoPE + KV-write kernel when enabled, else None (plain torch).

    "auto" uses Triton on CUDA only; "on" forces it (on CPU that needs TRITON_INTERPRET=1, which
    the tests use to run the kernel path against the reference); "off" never uses it.
    """
    if config.use_kernels == 'off':
        return None
    from ..kernels import is_triton_available, rope_kv_write
    on_cuda = getattr(device, 'type', str(device)) == 'cuda'
    if config.use_kernels == 'auto' and not (on_cuda and is_triton_available()):
        return None
    if not is_triton_available():
        raise ValueError('use_kernels: "on" needs triton on CUDA (or TRITON_INTERPRET=1)')

    def kernel(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
        # Index checks would read indices back to the host (a sync) on every layer; the
        # engine's planner already guarantees in-range, unique slots.
        return rope_kv_write(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping,
                             use_triton=True, check_indices=False)
    return kernel


def _describe(exc: BaseException) -> str:
    return f'{type(exc).__name__}: {exc}'
