"""Model-only speed for the demo: the `vla-spec bench` rows, and latency at a camera rate.

`model_speed_rows` is `bench.run_bench` on consecutive control steps (`--frames-from
metaworld-episodes`; a camera faster than inference, actions/s and the ratio to the Hugging
Face AR baseline measured in the same run). `paced_streams` feeds the
engine the way the ROS node does, from cameras at a fixed rate: whenever the engine loop comes
round, each camera's newest frame (if it is new) replaces the frame it still has waiting, then
the engine steps; `paced_latency` is one such camera.
It reports observation-to-action latency (capture to action) and the share of camera frames
answered: a mode that keeps up answers every frame; a slower one skips frames while it works,
which is the "one frame in flight" schedule of the delayed lock-step (sim/delayed_lockstep.py).
"""
from __future__ import annotations

import math
import time

import numpy as np

from vla_spec_ros.validation import check_number

PACED_STREAM = 'paced'
# `vla-spec bench --frames-from`: consecutive control steps of the scripted expert, as a
# robot's camera sees them (the default drafter drafts each frame with the previous action).
BENCH_FRAME_SOURCE = 'metaworld-episodes'


def capture_schedule(num_streams: int, frames_per_stream: int, rate_hz: float) -> list:
    """(capture offset s, stream index, frame index) in time order: stream r's k-th frame at
    (k + r / num_streams) / rate_hz (the cameras offset evenly within a period)."""
    period = 1.0 / rate_hz
    return sorted(((k + r / num_streams) * period, r, k)
                  for r in range(num_streams) for k in range(frames_per_stream))


def paced_streams(engine, frames_by_stream, rate_hz: float, warmup_frames: int = 0) -> list:
    """Each stream a camera at `rate_hz` (`capture_schedule`), served like the node does.

    Whenever the engine loop comes round, each camera's newest captured frame (if new)
    replaces the frame it still has waiting, in that frame's place in the queue
    (`Engine.replace_waiting`, as the node's worker); frames captured and replaced while the
    engine was busy were never seen. Then the engine steps. Latency runs from the frame's
    capture to the end of the step that finished its action, so it includes waiting for the
    step in progress. The first `warmup_frames` of each stream are served but not counted.
    Returns one `_paced_summary` per stream, the frames after the warm-up as its captures."""
    rate_hz = check_number('rate_hz', rate_hz, above=0.0)
    num_frames = min(len(frames) for frames in frames_by_stream)
    schedule = capture_schedule(len(frames_by_stream), num_frames, rate_hz)
    capture: dict[int, tuple[float, int, int]] = {}     # request id -> (time, stream, k)
    latencies = [[] for _ in frames_by_stream]
    start = time.perf_counter()
    due = 0                                             # schedule entries captured so far
    while True:
        newest = {}
        now = time.perf_counter() - start
        while due < len(schedule) and schedule[due][0] <= now:
            at, stream, k = schedule[due]
            newest[stream] = (at, k)
            due += 1
        for stream, (at, k) in newest.items():
            request_id, _ = engine.replace_waiting(frames_by_stream[stream][k])
            capture[request_id] = (start + at, stream, k)
        if engine.has_work():
            finished = engine.step()
            done = time.perf_counter()
            for fin in finished:
                if fin.error is not None:
                    raise RuntimeError(f'paced frame failed: {fin.error}')
                at, stream, k = capture.pop(fin.request_id)
                if k >= warmup_frames:
                    latencies[stream].append(done - at)
        elif due >= len(schedule):
            break
        else:
            time.sleep(max(0.0, start + schedule[due][0] - time.perf_counter()))
    elapsed = time.perf_counter() - start
    return [_paced_summary(lat, num_frames - warmup_frames, rate_hz, elapsed)
            for lat in latencies]


def paced_latency(engine, frames, rate_hz: float, num_frames: int | None = None) -> dict:
    """One camera at `rate_hz` (cycling through `frames`) served like the node does
    (`paced_streams`). Returns latency_p50_ms / p99 / max (camera capture to action, answered
    frames only), answered_fraction (answered / captured) and actions_per_s over the run."""
    num_frames = num_frames or len(frames)
    return paced_streams(engine, [[frames[i % len(frames)] for i in range(num_frames)]],
                         rate_hz)[0]


def paced_blocking(predict, frames, rate_hz: float, num_frames: int | None = None) -> dict:
    """`paced_latency` for a blocking predictor `predict(frame)` (the Hugging Face baseline):
    one frame at a time, always the newest captured one."""
    rate_hz = check_number('rate_hz', rate_hz, above=0.0)
    num_frames = num_frames or len(frames)
    period = 1.0 / rate_hz
    latencies = []
    start = time.perf_counter()
    taken = -1
    while taken < num_frames - 1:
        newest = min(int((time.perf_counter() - start) / period), num_frames - 1)
        if newest <= taken:
            time.sleep(max(0.0, start + (taken + 1) * period - time.perf_counter()))
            continue
        taken = newest
        predict(frames[newest % len(frames)])
        latencies.append(time.perf_counter() - (start + newest * period))
    return _paced_summary(latencies, num_frames, rate_hz, time.perf_counter() - start)


def _paced_summary(latencies, num_frames: int, rate_hz: float, elapsed: float) -> dict:
    lat = np.array(latencies) * 1e3
    return {'rate_hz': float(rate_hz), 'num_frames': num_frames, 'num_answered': len(latencies),
            'answered_fraction': len(latencies) / num_frames,
            'latency_p50_ms': float(np.percentile(lat, 50)) if len(lat) else math.nan,
            'latency_p99_ms': float(np.percentile(lat, 99)) if len(lat) else math.nan,
            'latency_max_ms': float(lat.max()) if len(lat) else math.nan,
            'actions_per_s': len(latencies) / elapsed}


def engine_for(policy, mode: str, draft_path: str | None = None, **options):
    """A new engine of `mode` on `policy`'s loaded model (weights shared, own ring)."""
    from pathlib import Path

    from vla_spec_ros.config import EngineConfig
    from vla_spec_ros.engine.engine import Engine
    values = {name: getattr(policy.config, name) for name in ('device', 'dtype',
                                                              'restrict_to_action_tokens')}
    values.update(options)
    cfg = EngineConfig(mode=mode, draft_path=draft_path, **values)
    runner = policy.engine.runner
    draft = None
    if cfg.is_speculative:
        from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
        draft = load_draft_for(runner, cfg, Path(policy.source))
    return Engine(runner, policy.engine.norm_stats, cfg, draft=draft)


def paced_rows(policy, modes, frames, rate_hz: float, num_frames: int,
               draft_path: str | None = None, warmup: int = 3) -> dict:
    """{mode: paced_latency(...)} for every engine mode and 'hf' (the Hugging Face baseline,
    `paced_blocking`), each after `warmup` unpaced frames."""
    rows = {}
    for mode in modes:
        if mode == 'hf':
            from vla_spec_ros.baseline import make_baseline
            baseline = make_baseline(policy.engine.runner, policy.config)   # the family's

            def predict(frame, baseline=baseline):
                # The whole frame (its cameras and state), as the engine's modes get it.
                return baseline.generate_frame(frame)
            for frame in frames[:warmup]:
                predict(frame)
            rows[mode] = paced_blocking(predict, frames, rate_hz, num_frames)
            continue
        engine = engine_for(policy, mode, draft_path)
        for frame in frames[:warmup]:
            engine.submit(frame)
            engine.run_until_idle()
        rows[mode] = paced_latency(engine, frames, rate_hz, num_frames)
    return rows


def model_speed_rows(model: str, modes, num_frames: int, device: str, dtype: str,
                     draft_path: str | None = None, seed: int = 1, warmup: int = 3,
                     frame_source: str = BENCH_FRAME_SOURCE) -> list:
    """`bench.run_bench` rows (hf first) for the demo's speed table, on `frame_source` frames
    (default: consecutive control steps, what the default drafter drafts from)."""
    from vla_spec_ros.bench import run_bench
    return run_bench(model, ['hf'] + [m for m in modes if m != 'hf'], num_frames, warmup,
                     device, dtype, seed, draft_path, frame_source=frame_source)


__all__ = ['PACED_STREAM', 'BENCH_FRAME_SOURCE', 'capture_schedule', 'paced_streams',
           'paced_latency', 'paced_rows', 'engine_for', 'model_speed_rows']
