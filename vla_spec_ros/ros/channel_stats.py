"""One robot's statistics at the points the channel reaches: an answered frame, its
/diagnostics status. The counters themselves are diagnostics.InferenceStats."""
from __future__ import annotations

import math
import time

from vla_spec_ros.ros.diagnostics import InferenceStats, diagnostic_status, frame_stages


def record_answer(stats: InferenceStats, info, result_stats: dict, age_s: float) -> None:
    """Statistics of a frame that was acted on: latency, acceptance, where its time went
    (frame_stages; a frame never converted has none), its image's age. `info`: its
    frame_slot.FrameInfo; `result_stats`: ActionResult.stats."""
    now = time.monotonic()
    stages = None if math.isnan(info.converted_mono) else frame_stages(
        info.receipt_mono, info.taken_mono, info.converted_mono,
        result_stats.get('latency_s', 0.0), result_stats.get('compute_s', 0.0), now)
    stats.record_action(now, now - info.receipt_mono, result_stats.get('accepted_lengths', ()),
                        stages, age_s=age_s)


def robot_status(stats: InferenceStats, *, name: str, hardware_id: str, mode: str,
                 is_enabled: bool, is_acting: bool, extras=()):
    """The robot's diagnostic_msgs/DiagnosticStatus; `extras`: objects with
    add_to_status(status) (Servo's contract, output adapters, inputs)."""
    status = diagnostic_status(stats.snapshot(time.monotonic()), name=name,
                               hardware_id=hardware_id, mode=mode, is_enabled=is_enabled,
                               is_acting=is_acting)
    for extra in extras:
        extra.add_to_status(status)
    return status


__all__ = ['record_answer', 'robot_status']
