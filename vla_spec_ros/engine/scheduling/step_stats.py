"""Where a decoding strategy's steps spend their time: the per-step cost model that
``vla-spec bench`` prints (plain Python)."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class StepStats:
    """Where a strategy's steps spent their time (seconds of host wall clock, summed since
    creation). On a GPU the device work is queued and charged where the host first waits
    for it: ``vision_s`` is the time to queue a prompt, and the towers' device time lands in
    the first read after it (the verifier's token read, or in the speculative modes the
    first draft level's read, in ``draft_s``)."""

    num_steps: int = 0
    num_advanced: int = 0       # requests that took part in a step, summed (prefills included)
    total_s: float = 0.0        # wall time inside ``step``
    vision_s: float = 0.0       # preparing prompts (upload, preprocessing, vision, projector)
    verifier_s: float = 0.0     # the packed verifier forward, its upload and token read
    draft_s: float = 0.0        # draft trees and draft updates (their forwards included)
    draft_forward_s: float = 0.0    # of ``draft_s``, inside the draft forwards (upload to
    #                                 host read); the rest is the drafter's host bookkeeping

    @property
    def host_s(self) -> float:
        """Bookkeeping outside the model calls: scheduling, planning, acceptance."""
        return self.total_s - self.vision_s - self.verifier_s - self.draft_s

    @property
    def draft_host_s(self) -> float:
        """The drafter's own host bookkeeping: tree growth, row layouts, uploads."""
        return self.draft_s - self.draft_forward_s

    def per_step_ms(self) -> dict:
        n = max(self.num_steps, 1)
        return {'step_ms': self.total_s / n * 1e3, 'host_ms': self.host_s / n * 1e3,
                'vision_ms': self.vision_s / n * 1e3, 'verifier_ms': self.verifier_s / n * 1e3,
                'draft_ms': self.draft_s / n * 1e3, 'draft_host_ms': self.draft_host_s / n * 1e3}

    def since(self, earlier: 'StepStats') -> 'StepStats':
        return StepStats(*(getattr(self, f.name) - getattr(earlier, f.name)
                           for f in fields(self)))


__all__ = ['StepStats']
