"""One robot's consecutive frames through a policy's engine, model only: each frame submitted
alone and run until decided, back to back or one every `period_s` as a camera sends them. The
loop the model-only bench scripts (draft_after_miss.py, paced_drafts.py) share."""
from __future__ import annotations

import time

WARMUP_FRAMES = 45      # frames run first and not measured (drafts need a previous action)


def run_frames(policy, frames, unnorm_key: str, period_s: float = 0.0,
               warmup: int = WARMUP_FRAMES) -> list[tuple]:
    """(ms, verifier forwards, tokens) of each frame after the first `warmup`, the engine reset
    first. With `period_s` > 0 a frame is submitted every `period_s` (none waits: a frame
    slower than the period delays the next one), so each starts from an idle engine, as it
    does behind the node."""
    from vla_spec_ros.engine.result import Frame

    engine = policy.engine
    engine.reset()
    measured, due = [], time.perf_counter()
    for i, f in enumerate(frames):
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        due = max(due, time.perf_counter()) + period_s
        start = time.perf_counter()
        engine.submit(Frame(f.image, f.instruction, unnorm_key, 'default', control_step=i))
        (done,) = engine.run_until_idle()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            measured.append((1e3 * elapsed, int(done.result.stats['forward_passes']),
                             tuple(done.result.tokens)))
    return measured


__all__ = ['WARMUP_FRAMES', 'run_frames']
