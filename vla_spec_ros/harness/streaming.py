"""The demo's streaming part: the real ROS 2 node fed by a camera at a fixed rate.

    camera (this process, own thread) --sensor_msgs/Image @ rate--> VLASpecNode (worker thread)
    twist listener                   <--TwistStamped (image stamp)--

Lock-step has no camera (a frame only exists once the previous action was applied), so it
cannot show what pipelining buys. Here a camera publishes consecutive control steps of the
scripted expert's episodes (the demo's tasks in turn, a new instruction with each task) at
`rate_hz`, whatever the node does, as a robot's camera would; the node keeps the newest frame
and drops the ones it had no time for. Each twist carries the stamp of the image it answers,
so every answer is matched to its frame: frame -> twist latency (publish to receipt, both in
this process), the share of frames answered and actions per second, per decoding mode, after a
warm-up that is not counted. The frames are rendered before anything is timed.

The Hugging Face baseline is not a node mode: it is measured model only (speed.paced_rows) at
the same rate on the same frames, and labelled so.

rclpy and the node are imported when a run starts; `stream_summary` and the frame helpers
import without them.
"""
from __future__ import annotations

import itertools
import math
import os
import threading
import time

import numpy as np

DEFAULT_STREAM_HZ = 30.0
DEFAULT_STREAM_SECONDS = 10.0
WARMUP_S = 1.5
# Generous on purpose: an answer older than this is held (zero twist) by the node and would
# be missing from the latency distribution instead of measured.
MAX_ACTION_AGE_S = 2.0
DRAIN_S = 1.0                 # after the last frame, how long answers are still awaited
SETTLE_S = 0.3                # after the camera and the node connect, before the first frame
PEER_TIMEOUT_S = 30.0
WHERE_NODE = 'ROS 2 node (DDS)'
WHERE_MODEL = 'model only (not on the node)'
_stream_ids = itertools.count()


def stream_frames(tasks, num_frames: int, image_size: int, seed: int,
                  unnorm_key: str | None = None) -> list:
    """`num_frames` engine Frames as one robot's camera sees them: consecutive control steps
    of the scripted expert's episodes, one episode of each task in turn (its first phrasing),
    episode seeds `seed`, `seed + 1`, ... (around again with new seeds when more are needed)."""
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.sim.metaworld_env import get_task, make_env
    if num_frames < 1:
        raise ValueError(f'num_frames: expected >= 1, got {num_frames!r}')
    frames = []
    for episode in itertools.count():
        task = get_task(tasks[episode % len(tasks)])
        episode_seed = seed + episode
        with make_env(task.name, seed=episode_seed, image_size=image_size) as env:
            image = env.reset(episode_seed)
            is_done = False
            while True:
                frames.append(Frame(image, task.instructions[0], unnorm_key, 'default'))
                if is_done or len(frames) >= num_frames:
                    break
                image, _, is_done, _ = env.step(env.expert_action())
        if len(frames) >= num_frames:
            return frames


def frame_counts(rate_hz: float, seconds: float, warmup_s: float = WARMUP_S) -> tuple[int, int]:
    """(warm-up frames, timed frames) of a camera at `rate_hz` for `seconds`."""
    return max(1, round(warmup_s * rate_hz)), max(1, round(seconds * rate_hz))


def answered_stamp(stamp, known, chunk_steps: int = 1, chunk_period_s: float = 0.0):
    """The image stamp a twist stamped `stamp` answers, or None: `stamp` itself when it is in
    `known`, else, for a chunked model (`chunk_steps` K > 1), the stamp that is i control
    periods earlier (0 < i < K) and in `known`: the node stamps step i of a frame's chunk
    with the image's stamp + i * control_period (ros/chunk_execution.py, offset_stamp)."""
    if stamp in known:
        return stamp
    total = stamp[0] * 1_000_000_000 + stamp[1]
    for i in range(1, chunk_steps):
        earlier = total - round(i * chunk_period_s * 1e9)
        candidate = (earlier // 1_000_000_000, earlier % 1_000_000_000)
        if candidate in known:
            return candidate
    return None


def stream_summary(published: dict, answers: list, rate_hz: float,
                   warmup_stamps=frozenset(), chunk_steps: int = 1,
                   chunk_period_s: float = 0.0) -> dict:
    """The numbers of one streaming run.

    `published`: {stamp: publish time s} of the timed frames (stamps unique); `answers`:
    [(stamp, receipt time s)] of every twist received; `warmup_stamps`: those of the warm-up
    frames. A twist answers a timed frame when its stamp is one of them (for a chunked model,
    `chunk_steps` K > 1 at `chunk_period_s`: when it is a step of that frame's chunk,
    `answered_stamp`); a frame's latency is to the first twist of it received (a chunk whose
    first slot passed in flight starts at a later step). Answers to warm-up frames and twists
    answering no published frame (the node's zero twists: holds) are counted apart; a frame's
    later chunk steps are counted as neither answers nor duplicates. actions/s: answered
    frames over the camera's timed span (frames / rate)."""
    latencies, seen, duplicates, unmatched, warmup = [], set(), 0, 0, 0
    known = set(published) | set(warmup_stamps)
    for stamp, received in answers:
        image = answered_stamp(stamp, known, chunk_steps, chunk_period_s)
        if image is not None and image in warmup_stamps:
            warmup += 1
        elif image is None:
            unmatched += 1
        elif image in seen:
            if image == stamp and chunk_steps == 1:
                duplicates += 1
        else:
            seen.add(image)
            latencies.append(received - published[image])
    lat = np.array(latencies) * 1e3
    num = len(published)
    span_s = num / rate_hz
    return {'rate_hz': float(rate_hz), 'num_frames': num, 'num_answered': len(latencies),
            'answered_fraction': len(latencies) / num if num else math.nan,
            'latency_p50_ms': float(np.percentile(lat, 50)) if len(lat) else math.nan,
            'latency_p99_ms': float(np.percentile(lat, 99)) if len(lat) else math.nan,
            'latency_mean_ms': float(lat.mean()) if len(lat) else math.nan,
            'latency_min_ms': float(lat.min()) if len(lat) else math.nan,
            'actions_per_s': len(latencies) / span_s if span_s > 0 else math.nan,
            'num_warmup_answers': warmup, 'num_unmatched_twists': unmatched,
            'num_duplicate_twists': duplicates}


class _Camera:
    """A node publishing pre-built Image messages and recording the twists that come back."""

    def __init__(self, context, namespace: str, vla_ns: str):
        from geometry_msgs.msg import TwistStamped
        from rclpy.node import Node
        from sensor_msgs.msg import Image

        from vla_spec_ros.ros.qos import COMMAND_QOS, IMAGE_PUBLISHER_QOS
        self.node = Node('stream_camera', context=context, namespace=namespace)
        self.image_pub = self.node.create_publisher(Image, f'{vla_ns}/image',
                                                    IMAGE_PUBLISHER_QOS)
        self._lock = threading.Lock()
        # (stamp (sec, nanosec), receipt time s, whether the twist is all zeros)
        self.answers: list[tuple[tuple[int, int], float, bool]] = []
        self.node.create_subscription(TwistStamped, f'{vla_ns}/twist', self._on_twist,
                                      COMMAND_QOS)
        self.twist_topic = f'{vla_ns}/twist'

    def _on_twist(self, msg) -> None:
        received = time.perf_counter()
        t = msg.twist
        is_zero = not any((t.linear.x, t.linear.y, t.linear.z,
                           t.angular.x, t.angular.y, t.angular.z))
        with self._lock:
            self.answers.append(((msg.header.stamp.sec, msg.header.stamp.nanosec), received,
                                 is_zero))

    def snapshot(self) -> list:
        with self._lock:
            return list(self.answers)

    def clear(self) -> None:
        with self._lock:
            self.answers.clear()

    def is_connected(self) -> bool:
        return (self.image_pub.get_subscription_count() > 0
                and self.node.count_publishers(self.twist_topic) > 0)


def _set_instruction(vla, instruction: str) -> None:
    from rclpy.parameter import Parameter
    result = vla.set_parameters([Parameter('instruction', value=instruction)])[0]
    if not result.successful:
        raise ValueError(f'instruction: refused by the VLA node: {result.reason}')


def run_stream_mode(policy, frames, rate_hz: float, num_warmup: int, unnorm_key: str, *,
                    namespace: str | None = None, log_level: str | None = None,
                    max_action_age_s: float = MAX_ACTION_AGE_S, trace: dict | None = None,
                    node_parameters: dict | None = None) -> dict:
    """`policy` behind a real VLASpecNode; frames[:num_warmup] are published as warm-up, the
    rest timed, one every 1 / `rate_hz` s. Returns stream_summary(...) of the timed frames
    plus the node's own counters over them. `node_parameters` (optional): node parameter
    values over the ones this harness sets (e.g. torch_threads or chunk_blend, to compare).
    `trace` (optional) receives what was matched:
    'published' {stamp: publish time} of the timed frames, 'warmup' their stamps, 'answers'
    [(stamp, receipt time, is zero twist)] of every twist received while streaming."""
    import rclpy
    from rclpy.parameter import Parameter

    from vla_spec_ros.harness.closed_loop import _set_log_level, vla_parameters
    from vla_spec_ros.harness.node_threads import NodeThreads
    from vla_spec_ros.image_messages import array_to_image
    from vla_spec_ros.ros.node import VLASpecNode
    from vla_spec_ros.ros.model_io import chunk_steps_of

    if not 0 <= num_warmup < len(frames):
        raise ValueError(f'num_warmup: expected 0 <= num_warmup < {len(frames)} frames, got '
                         f'{num_warmup!r}')
    period = 1.0 / rate_hz
    messages = [array_to_image(np.ascontiguousarray(f.image), 'rgb8', frame_id='camera')
                for f in frames]                      # built before anything is timed
    namespace = namespace or f'/stream_{os.getpid()}_{next(_stream_ids)}'
    vla_ns = f'{namespace}/vla_spec'
    values = vla_parameters(policy, unnorm_key, 'realtime', rate_hz)
    values.update(enabled=True, instruction=frames[0].instruction,
                  max_action_age=float(max_action_age_s))
    values.update(node_parameters or {})
    context = rclpy.Context()
    rclpy.init(context=context)
    nodes, spinning = [], None
    if log_level is not None:
        _set_log_level([vla_ns], log_level)
    try:
        vla = VLASpecNode(policy=policy, context=context, namespace=namespace,
                          parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
        nodes.append(vla)
        camera = _Camera(context, namespace, vla_ns)
        nodes.append(camera.node)
        # The node on a thread of its own, the camera on another, as two processes would be.
        spinning = NodeThreads(context, [[vla], [camera.node]], name='stream')
        deadline = time.monotonic() + PEER_TIMEOUT_S
        while not camera.is_connected():
            if time.monotonic() > deadline:
                raise RuntimeError('the camera and the VLA node did not connect')
            time.sleep(0.01)
        time.sleep(SETTLE_S)       # the zero twists of the node's start (no image yet) ...
        camera.clear()             # ... are not answers to anything this camera sent
        published: dict[tuple[int, int], float] = {}
        warmup_stamps = set()
        instruction = frames[0].instruction
        forwards, snapshot = None, None
        start = time.perf_counter()
        for i, (frame, msg) in enumerate(zip(frames, messages)):
            if i == num_warmup:
                forwards = policy.engine.num_verifier_forwards
                snapshot = vla.stats_snapshot()
            if frame.instruction != instruction:     # a new task: the node's next instruction
                instruction = frame.instruction
                _set_instruction(vla, instruction)
            wait = start + i * period - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            msg.header.stamp = camera.node.get_clock().now().to_msg()
            sent = time.perf_counter()
            camera.image_pub.publish(msg)
            stamp = (msg.header.stamp.sec, msg.header.stamp.nanosec)
            if i >= num_warmup:
                published[stamp] = sent
            else:
                warmup_stamps.add(stamp)
        _drain(camera, published, DRAIN_S)
        after = vla.stats_snapshot()
        answers = camera.snapshot()
        if trace is not None:
            trace.update(published=published, warmup=warmup_stamps, answers=answers)
        summary = stream_summary(published, [(stamp, t) for stamp, t, _ in answers], rate_hz,
                                 warmup_stamps, chunk_steps=chunk_steps_of(policy),
                                 chunk_period_s=float(values['control_period']))
        summary['publish_span_s'] = time.perf_counter() - start
        num_actions = after['actions_published'] - snapshot['actions_published']
        summary['node'] = {key: after[key] - snapshot[key] for key in (
            'frames_received', 'frames_dropped', 'frames_stale', 'actions_published', 'holds',
            'errors', 'verify_steps', 'accepted_tokens')}
        summary['forwards_per_action'] = ((policy.engine.num_verifier_forwards - forwards)
                                          / num_actions if num_actions else math.nan)
        verify = summary['node']['verify_steps']
        summary['acceptance_length'] = (summary['node']['accepted_tokens'] / verify
                                        if policy.config.is_speculative and verify
                                        else math.nan)
        summary['max_action_age_s'] = float(max_action_age_s)
        return summary
    finally:
        if spinning is not None:     # the spin threads end before any node is destroyed
            spinning.shutdown()
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown(context=context)


def _drain(camera, published: dict, wait_s: float) -> None:
    """Wait until the last timed frame is answered, or until no twist came for `wait_s`."""
    last = max(published, default=None)
    count, quiet_since = len(camera.snapshot()), time.perf_counter()
    while time.perf_counter() - quiet_since < wait_s:
        answers = camera.snapshot()
        if any(stamp == last for stamp, _, _ in answers):
            return
        if len(answers) != count:
            count, quiet_since = len(answers), time.perf_counter()
        time.sleep(0.01)


def _load_avg() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return math.nan


def mode_drafter(mode: str, draft_path: str | None, default_draft: str | None = None) -> str:
    """How a mode drafts: '-' for the non-speculative ones. Without a `draft_path`, the
    model's default draft (`model_default_draft`, e.g. π0-FAST's
    'previous_action+shifted_chunk'; None: the previous action)."""
    if mode not in ('spec', 'pipeline_spec'):
        return '-'
    path = draft_path or default_draft or 'previous_action'
    if path == 'checkpoint':
        return 'EAGLE head (checkpoint draft/)'
    if all(part.isidentifier() for part in path.split('+')):      # headless drafters' names
        return ' + '.join(part.replace('_', ' ') for part in path.split('+'))
    return path


def model_default_draft(policy) -> str:
    """The draft the engine runs for `policy` when no draft_path is given."""
    from vla_spec_ros.engine.drafting.draft_choice import default_draft_path
    return default_draft_path(policy.engine.runner)


def is_default_configuration(mode: str, draft_path: str | None, relax_threshold: int = 0) -> bool:
    """Whether (mode, draft_path, r) is what EngineConfig() runs."""
    from vla_spec_ros.config import EngineConfig
    default = EngineConfig()
    return (mode == default.mode and relax_threshold == default.relax_threshold
            and (draft_path or None) == default.draft_path)


def run_stream(model: str, modes, tasks, *, rate_hz: float, seconds: float, seed: int,
               unnorm_key: str, dtype: str = 'float32', device: str = 'cpu',
               draft_path: str | None = None, restrict_to_action_tokens: bool = False,
               include_hf: bool = True, log_level: str | None = 'error', frames=None,
               on_row=None) -> dict:
    """Every mode on the node at `rate_hz` for `seconds` (after WARMUP_S), then the Hugging
    Face baseline model only on the same timed frames. `frames` (optional): pre-rendered
    stream_frames, at least warm-up + timed. `on_row(row)` is called after each row."""
    from vla_spec_ros.harness import speed
    from vla_spec_ros.policy import VLAPolicy

    options = dict(dtype=dtype, device=device,
                   restrict_to_action_tokens=restrict_to_action_tokens)
    num_warmup, num_timed = frame_counts(rate_hz, seconds)
    rows = []
    for mode in modes:
        speculative = mode in ('spec', 'pipeline_spec')
        policy = VLAPolicy.from_pretrained(model, mode=mode,
                                           draft_path=draft_path if speculative else None,
                                           **options)
        if frames is None:
            frames = stream_frames(tasks, num_warmup + num_timed,
                                   policy.model_config.image_size, seed, unnorm_key)
        load = _load_avg()
        row = run_stream_mode(policy, frames[:num_warmup + num_timed], rate_hz, num_warmup,
                              unnorm_key, log_level=log_level)
        row.update(load_avg_1m=[load, _load_avg()], mode=mode, where=WHERE_NODE,
                   drafter=mode_drafter(mode, draft_path if speculative else None,
                                        model_default_draft(policy)),
                   is_default=is_default_configuration(
                       mode, draft_path if speculative else None))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    if include_hf:
        policy = VLAPolicy.from_pretrained(model, **options)
        if frames is None:
            frames = stream_frames(tasks, num_warmup + num_timed,
                                   policy.model_config.image_size, seed, unnorm_key)
        timed = frames[num_warmup:num_warmup + num_timed]
        load = _load_avg()
        row = speed.paced_rows(policy, ['hf'], timed, rate_hz, len(timed))['hf']
        row.update(load_avg_1m=[load, _load_avg()], mode='hf', where=WHERE_MODEL, drafter='-',
                   is_default=False, latency_mean_ms=math.nan)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return {'rate_hz': float(rate_hz), 'seconds': float(seconds), 'warmup_s': WARMUP_S,
            'num_warmup_frames': num_warmup, 'num_frames': num_timed, 'seed': seed,
            'frames': 'consecutive control steps of the scripted expert, one episode per task '
                      'in turn (harness/streaming.stream_frames)',
            'max_action_age_s': MAX_ACTION_AGE_S, 'rows': rows}


__all__ = ['DEFAULT_STREAM_HZ', 'DEFAULT_STREAM_SECONDS', 'WARMUP_S', 'MAX_ACTION_AGE_S',
           'WHERE_NODE', 'WHERE_MODEL', 'stream_frames', 'frame_counts', 'stream_summary',
           'answered_stamp',
           'run_stream_mode', 'run_stream', 'mode_drafter', 'is_default_configuration']
