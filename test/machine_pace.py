"""Test rates and deadlines scaled to what this machine measures, not to a fast machine.

A real-time test (a camera and a control clock against the node) holds only if one frame's
inference fits in the control period it assumes. Machines differ by 2x or more, and a shared CI
machine is loaded: so the rate comes from the policy's measured latency on this machine, at the
time the test runs, with a stated margin; the assertions stay as they are.
"""
import time

import numpy as np


def frame_latency_s(policy, instruction: str, unnorm_key: str, num_frames: int = 3) -> float:
    """The slowest of ``num_frames`` blocking ``predict`` calls (after one not timed), seconds."""
    size = policy.model_config.image_size
    image = np.zeros((size, size, 3), np.uint8)
    policy.predict(image, instruction, unnorm_key)
    latencies = []
    for _ in range(num_frames):
        start = time.perf_counter()
        policy.predict(image, instruction, unnorm_key)
        latencies.append(time.perf_counter() - start)
    return max(latencies)


def control_rate_for(policy, instruction: str, unnorm_key: str, *, max_hz: float,
                     periods_per_frame: float = 0.25) -> float:
    """The highest control rate (at most ``max_hz``) at which one frame's measured inference
    takes at most ``periods_per_frame`` control periods: the node's own overheads (DDS, image
    conversion, the camera's and the chunk clock's timers) get the rest of the period."""
    latency = frame_latency_s(policy, instruction, unnorm_key)
    return min(max_hz, periods_per_frame / latency)
