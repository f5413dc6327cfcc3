"""The streaming engine: submit frames, step, collect finished actions.

This is the public interface the ROS node and ``VLAPolicy.predict`` use. Input is validated at
``submit`` (image, instruction, ``unnorm_key``) so bad input raises there and never enters a
packed step. Every mode is one ``PackedStrategy`` (engine/packed.py): ``step()`` runs one packed
verifier forward (in "ar" the prefill or one decode token of the single request in flight).
Failures inside a step are reported as ``FinishedAction.error`` for the requests they hit,
never raised, so a serving loop keeps running.
"""
from __future__ import annotations

import itertools
import time

import numpy as np

from ..actions import resolve_unnorm_key, stats_by_key
from ..config import TUNABLE_ENGINE_FIELDS, EngineConfig
from .packed import PackedStrategy
from .reasoning_reuse import ReasoningReuse
from .scheduling.request import Request
from .result import ActionResult, FinishedAction, Frame, describe_error
from .device.runner import ModelRunner


def _reuse_context(request: Request) -> tuple:
    """What a kept reasoning is valid under: the frame's instruction and statistics."""
    return (request.frame.instruction, request.unnorm_key)


def _check_reasoning_reuse(config: EngineConfig, codec) -> None:
    """``reasoning_every_n`` > 1 means something only for a model that writes reasoning."""
    if config.reasoning_every_n > 1 and not getattr(codec, 'writes_reasoning', False):
        raise ValueError(f'reasoning_every_n: {config.reasoning_every_n} given, but this model '
                         'writes no reasoning before its action (use 1)')


def _action_dim(codec) -> int | None:
    """The dimensions of one action step (the last of the codec's ``action_shape``); None
    for a codec that does not say."""
    shape = tuple(getattr(codec, 'action_shape', ()) or ())
    return int(shape[-1]) if shape else None


class Engine:
    """The one place an engine is put together: a loaded model's runner (shared by every
    engine over that model), the dataset statistics and one EngineConfig; the drafter is the
    one ``config.draft_path`` names (engine/drafting/draft_choice.py) unless ``draft`` is given
    (tests and benchmarks pass doubles)."""

    def __init__(self, runner: ModelRunner, norm_stats: dict, config: EngineConfig,
                 draft=None, stats_source: str | None = None):
        # The statistics are checked before anything loads (``stats_source``: the file they
        # came from, for errors): values that pass here un-normalise every frame.
        self._stats = stats_by_key(norm_stats, _action_dim(runner.codec), stats_source)
        if draft is None and config.is_speculative:
            from .drafting.draft_choice import load_draft_for
            draft = load_draft_for(runner, config, runner.checkpoint_folder)
        elif draft is None:
            # A mode that does not draft still refuses a draft_path that could not load.
            from .drafting.draft_choice import check_draft_path
            check_draft_path(config.draft_path, runner.checkpoint_folder)
        self.runner = runner
        self.norm_stats = norm_stats
        self._config = config
        # No frame fits when even an empty instruction's prompt and the output's budget (a
        # reasoning policy's text) exceed the model's positions: refused here, not per frame.
        shortest = runner.max_prefix_len(0) + runner.max_action_tokens + config.tree_depth
        if shortest > runner.max_positions:
            raise ValueError(f'max_reasoning_tokens: a frame needs at least {shortest} '
                             f'positions ({runner.max_action_tokens} output tokens); the model '
                             f'has {runner.max_positions}')
        self._ids = itertools.count()
        _check_reasoning_reuse(config, runner.codec)
        self._reuse = ReasoningReuse()
        self.strategy = PackedStrategy(runner, config, draft)
        self.strategy.on_admit = self._on_admit

    # ---- configuration ----------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def num_verifier_forwards(self) -> int:
        """Packed verifier forwards run so far (stats)."""
        return self.strategy.num_verifier_forwards

    def set_tunables(self, **changes) -> None:
        """Change relax_threshold / tree sizes between frames (validated; no reload)."""
        config = self.check_tunables(**changes)
        self.strategy.config_changed(config)
        self._config = config

    def check_tunables(self, **changes) -> EngineConfig:
        """The config ``set_tunables(**changes)`` would give, checked as it checks it (this
        model and this load: a reasoning reuse the model cannot do, a relaxation its codec
        has no bins for, a tree larger than the scratch reserved); nothing changes. A caller
        that accepts settings for later (the node's parameters) refuses them here, at once."""
        bad = sorted(set(changes) - set(TUNABLE_ENGINE_FIELDS))
        if bad:
            raise ValueError(f'{bad} cannot change at run time; tunables are '
                             f'{list(TUNABLE_ENGINE_FIELDS)}')
        config = self._config.replace(**changes)
        _check_reasoning_reuse(config, self.runner.codec)
        self.strategy.check_config(config)
        return config

    # ---- submission ---------------------------------------------------------------------------

    def submit(self, frame: Frame) -> int:
        """Validate and enqueue a frame; raises ValueError on bad input (nothing is queued).

        At most ``max_streams`` streams may have unfinished frames at once: a frame of a new
        stream beyond that is refused (the node sizes it to its number of robots)."""
        request = self._new_request(frame)
        self.strategy.submit(request)
        return request.request_id

    def replace_waiting(self, frame: Frame) -> tuple[int, list[int]]:
        """Validate ``frame`` and queue it in place of its stream's frames not yet started
        (a camera's newest frame wins); returns (its request id, the replaced request ids).
        It keeps the queue position of the oldest frame it replaces, so a robot whose frames
        keep being replaced is not passed over by the other robots. Raises ValueError on bad
        input, and then nothing is queued or replaced."""
        request = self._new_request(frame)
        replaced = self.strategy.replace_waiting(request)
        return request.request_id, [r.request_id for r in replaced]

    def check_frame(self, frame: Frame) -> None:
        """ValueError naming what ``submit`` would refuse in ``frame`` itself (images,
        instruction, state, dataset key, prompt length), or None; nothing is queued. (Which
        streams are busy is not checked: that changes from step to step.)"""
        self._checked_prompt(frame)

    def _checked_prompt(self, frame: Frame) -> tuple[list[int], str, int]:
        """(prompt ids, dataset key, prefix length) of a valid frame."""
        self.runner.check_frame(frame)
        input_ids = self.runner.frame_prompt_ids(frame)
        key = resolve_unnorm_key(self.norm_stats, frame.unnorm_key)
        prefix_len = self.runner.prefix_len(input_ids, len(frame.images))
        longest = prefix_len + self.runner.max_action_tokens + self._config.tree_depth
        if longest > self.runner.max_positions:
            raise ValueError(f'prompt needs {longest} positions; the model has '
                             f'{self.runner.max_positions}')
        return input_ids, key, prefix_len

    def _new_request(self, frame: Frame) -> Request:
        """The request of a valid frame; ValueError naming what is wrong otherwise."""
        if not isinstance(frame.stream_id, str) or not frame.stream_id:
            raise ValueError(f'stream_id: a non-empty string naming the camera stream, got '
                             f'{frame.stream_id!r}')
        active = self.strategy.active_streams
        if frame.stream_id not in active and len(active) >= self._config.max_streams:
            raise ValueError(f'stream_id: {frame.stream_id!r} would be stream {len(active) + 1} '
                             f'with unfinished frames; max_streams is '
                             f'{self._config.max_streams} (busy: {sorted(active)})')
        input_ids, key, prefix_len = self._checked_prompt(frame)
        max_tokens = self.runner.max_action_tokens
        request = Request(next(self._ids), frame.stream_id, prefix_len, max_tokens,
                          self.strategy.slots_for(prefix_len), frame=frame,
                          input_ids=input_ids, unnorm_key=key, control_step=frame.control_step,
                          submit_time=time.perf_counter())
        return request

    def _on_admit(self, request: Request) -> None:
        """A request about to start (its prefill): the reasoning it must begin with, when
        ``reasoning_every_n`` > 1 (engine/reasoning_reuse.py: decided here, not at submission,
        so a frame replaced before it started is not counted)."""
        request.forced = self._reuse.forced_for(request.stream_id,
                                                self._config.reasoning_every_n,
                                                _reuse_context(request))

    def has_work(self) -> bool:
        return self.strategy.has_work()

    @property
    def busy_streams(self) -> tuple[str, ...]:
        """Streams with a frame waiting or in flight, sorted."""
        return tuple(sorted(self.strategy.active_streams))

    @property
    def num_inflight(self) -> int:
        """Requests admitted (prefill done) and not yet finished."""
        return self.strategy.num_inflight

    @property
    def waiting_streams(self) -> frozenset:
        """Streams with a submitted frame not yet started."""
        return self.strategy.waiting_streams

    def has_waiting(self) -> bool:
        """True while a submitted frame has not started (its prefill is not done)."""
        return self.strategy.has_waiting()

    def drop_waiting(self, stream_id: str) -> list[int]:
        """Drop frames of ``stream_id`` not yet started (to replace one with a newer frame,
        ``replace_waiting`` keeps the stream's place in the queue)."""
        return [r.request_id for r in self.strategy.drop_waiting(stream_id)]

    def reset(self, stream_id: str | None = None) -> list[int]:
        """Drop waiting and in-flight requests (of one stream, or all)."""
        self._reuse.forget(stream_id)
        return [r.request_id for r in self.strategy.reset(stream_id)]

    def capture_graphs(self, frame: Frame) -> int:
        """With ``use_cuda_graphs``: capture every verifier step shape that frames with this
        frame's instruction can meet, before serving (capturing mid-stream costs a frame's
        latency). The vision graph is captured from the frame itself. Returns the number of
        step shapes built (0 without graphs)."""
        if not self._config.use_cuda_graphs:
            return 0
        self.runner.check_frame(frame)
        input_ids = self.runner.frame_prompt_ids(frame)
        self.runner.prepare_prompt(frame, self._config, input_ids)
        return self.strategy.capture_graphs(self.runner.prefix_len(input_ids,
                                                                   len(frame.images)))

    # ---- stepping -----------------------------------------------------------------------------

    def step(self) -> list[FinishedAction]:
        """One packed forward (plus its drafting); finished actions in per-stream order."""
        try:
            finished = self.strategy.step()
        except Exception as exc:   # report to every affected request; keep serving
            return [FinishedAction(r.request_id, r.frame, None, describe_error(exc))
                    for r in self.strategy.abort_all()]
        return [self.finish(r) for r in finished]

    def run_until_idle(self, max_steps: int = 100000) -> list[FinishedAction]:
        out: list[FinishedAction] = []
        for _ in range(max_steps):
            if not self.has_work():
                return out
            out.extend(self.step())
        raise RuntimeError(f'engine still busy after {max_steps} steps')

    def finish(self, request: Request) -> FinishedAction:
        """Tokens -> ActionResult (de-tokenise, un-normalise, validity check)."""
        codec = self.runner.codec
        decoded = codec.decode(request.tokens)
        if self._config.reasoning_every_n > 1:
            self._reuse.observe(request.stream_id, codec.reasoning_prefix(request.tokens),
                                bool(request.forced), _reuse_context(request))
        stats = self._stats[request.unnorm_key]
        is_valid, reason = decoded.is_valid, decoded.invalid_reason
        normalized = decoded.normalized
        if not np.isfinite(normalized).all():   # a non-action token's NaN (nan_to_num is slow)
            normalized = np.nan_to_num(normalized, nan=0.0)
        action = stats.unnormalize(normalized)
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
                   'prefill_accepted': request.prefill_accepted,
                   'latency_s': now - request.submit_time,
                   'compute_s': now - (request.start_time or request.submit_time),
                   'unnorm_key': request.unnorm_key, 'num_tokens': len(request.tokens),
                   'reasoning_reused': bool(request.forced),
                   'num_forced': len(request.forced)},
            reasoning=self.runner.codec.describe(request.tokens))
        return FinishedAction(request.request_id, request.frame, result, None)
