"""One frame's request: the single record every stage of the engine reads and updates.

Plain Python (no torch). The scheduler owns requests from ``submit`` until they are emitted or
dropped; the decoding strategy appends decided tokens through ``Scheduler.on_tokens`` and keeps
its per-request notes here (the KV compaction still to apply), so nothing about a request is
kept in step by hand in several dictionaries. The one exception is the drafter's own device
state (its KV lane), which lives inside the drafter from ``begin`` to ``release``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Request:
    """Scheduling view plus decoding state of one camera frame.

    ``num_slots`` = ring slots reserved from admission until the request finishes: prefix_len
    + num_tokens_needed + the per-request tree scratch.
    """

    request_id: int         # increases with submission order, over all streams
    stream_id: str
    prefix_len: int         # prefill tokens (BOS + image patches + instruction text)
    num_tokens_needed: int  # most tokens to decide (the codec's max_tokens)
    num_slots: int
    # What the engine needs to run and report the request (unused by the scheduler).
    frame: Any = None
    input_ids: list[int] = field(default_factory=list)
    unnorm_key: str | None = None
    control_step: int | None = None        # the frame's (Frame.control_step)
    submit_time: float = 0.0
    start_time: float | None = None
    # Decoding state.
    tokens: list[int] = field(default_factory=list)         # decided so far, in order
    forward_passes: int = 0                                 # verifier forwards it rode in
    accepted_lengths: list[int] = field(default_factory=list)
    prefill_accepted: int = 0       # drafted tokens its prefill accepted (speculative prefill)
    # Its last verification that had a draft accepted none of it (the codec's
    # draft_after_miss then bounds its next draft; a hit lifts the bound).
    draft_missed: bool = False
    # KV compaction of the last accepted tree path, (src, dst) physical ring slots: applied at
    # the start of every layer of the request's next verifier forward (before any KV write).
    pending_moves: list[tuple[int, int]] = field(default_factory=list)
    # The run-time tunables in force when the request was admitted (relax_threshold and the
    # tree sizes): a change applies from the next admitted frame, never part-way through one.
    tunables: Any = None
    # Tokens the output must begin with, taken as decided without verification (a reused
    # reasoning: engine/reasoning_reuse.py); empty for every exact frame.
    forced: tuple = ()

    def __post_init__(self):
        for name in ('request_id', 'prefix_len', 'num_tokens_needed', 'num_slots'):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f'{name}: must be an int, got {value!r}')
        if self.request_id < 0:
            raise ValueError(f'request_id: must be >= 0, got {self.request_id}')
        if self.prefix_len < 1:
            raise ValueError(f'prefix_len: must be >= 1, got {self.prefix_len}')
        if self.num_tokens_needed < 1:
            raise ValueError(f'num_tokens_needed: must be >= 1, got {self.num_tokens_needed}')
        # Every decided token except the last one is fed back and needs a KV slot.
        num_min = self.prefix_len + self.num_tokens_needed - 1
        if self.num_slots < num_min:
            raise ValueError(f'num_slots: {self.num_slots} < prefix_len + num_tokens_needed '
                             f'- 1 = {num_min}')

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_remaining(self) -> int:
        return self.num_tokens_needed - len(self.tokens)

    @property
    def history_len(self) -> int:
        """KV entries in the ring once a token is decided: prefix_len + num_tokens - 1.

        The next work item feeds the last decided token (a decode input or a tree root) at
        this logical position; its own KV is not in the ring yet.
        """
        if not self.tokens:
            raise ValueError(f'request_id: {self.request_id} has no token yet (prefill pending)')
        return self.prefix_len + len(self.tokens) - 1
