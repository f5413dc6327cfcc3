"""``vla-spec bench``: actions/s, latency p50/p99 and forward passes per action per mode, with
ratios against the Hugging Face AR baseline measured in the same run on the same weights, and
the cost model of one packed step: ms per step and where it goes (host bookkeeping, vision,
verifier forward, drafting).

Workload: one camera per stream, each always faster than inference (a stream has a fresh
frame waiting whenever its previous one was admitted; frames go to the streams in turn),
``num_frames`` frames with varying instructions, after ``warmup`` frames run the same way (so
every shape bucket the timed frames need is already built). With several streams and
``max_prefills_per_step`` > 1 the pipelined modes admit several waiting frames per step. Latency is
submit-to-action per frame. All modes share one loaded model.

``--sweep-inflight 1,2,4,7,14`` times pipeline steps at each ``max_inflight`` (segment
attention, then the dense reference attention for contrast): a step's cost must follow the
work in flight, not the size of the ring.
"""
from __future__ import annotations

import copy
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .config import EngineConfig
from .engine.engine import Engine
from .engine.result import Frame

NAN = float('nan')

INSTRUCTIONS = ('pick up the red cup', 'open the top drawer', 'push the blue block left',
                'close the window', 'press the button', 'put the bowl on the plate')


@dataclass
class BenchRow:
    mode: str
    num_actions: int
    actions_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    forwards_per_action: float
    acceptance_length: float
    ratio_vs_hf: float = NAN
    latency_ratio_vs_hf: float = NAN
    step_ms: float = NAN            # wall time of one packed step (drafting included)
    host_ms: float = NAN            # of which host bookkeeping outside model calls
    vision_ms: float = NAN
    verifier_ms: float = NAN
    draft_ms: float = NAN
    draft_host_ms: float = NAN      # of which the drafter's host bookkeeping (trees, layouts)
    steps_per_action: float = NAN
    inflight_per_step: float = NAN  # requests advanced per step (prefill included)
    tokens_per_action: float = NAN  # generated tokens per frame (a FAST chunk's vary)


FRAME_SOURCES = ('random', 'metaworld', 'metaworld-episodes')


def make_frames(num: int, image_size: int, seed: int, unnorm_key: str,
                num_streams: int = 1, source: str = 'random') -> list[Frame]:
    """The benchmark's frames. ``random``: uniform noise images (any model, no simulator);
    ``metaworld``: held-out Meta-World observations of the embedded model's tasks
    (``sim.frames.benchmark_frames``), the images that model is trained on: its draft head is
    surer of them than of noise, so speculation is measured as a robot would see it, the tasks
    taken in turn frame by frame; ``metaworld-episodes``: each stream a robot's camera, runs
    of consecutive control steps of one task after another (``sim.frames.episode_frames``),
    what temporal drafting (``draft_path: previous_action``) drafts from."""
    if source == 'metaworld':
        from .sim.frames import benchmark_frames
        return benchmark_frames(num, image_size, seed, unnorm_key, num_streams)
    if source == 'metaworld-episodes':
        from .sim.frames import episode_frames
        return episode_frames(num, image_size, seed, unnorm_key, num_streams)
    if source != 'random':
        raise ValueError(f'frame source {source!r}: expected one of {FRAME_SOURCES}')
    rng = np.random.default_rng(seed)
    return [Frame(rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8),
                  INSTRUCTIONS[i % len(INSTRUCTIONS)], unnorm_key, f'stream{i % num_streams}')
            for i in range(num)]


def _saturate(engine: Engine, frames: list[Frame]):
    """Saturating cameras: the next frame is offered as soon as its stream has none waiting
    (frames in order: one stream's waiting frame holds back the later frames of every
    stream). Returns per finished frame (request id, latency s, accepted lengths)."""
    pending = list(frames)
    submit_at: dict[int, float] = {}
    finished = []
    while pending or engine.has_work():
        waiting = set(engine.waiting_streams)
        while pending and pending[0].stream_id not in waiting:
            frame = pending.pop(0)
            submit_at[engine.submit(frame)] = time.perf_counter()
            waiting.add(frame.stream_id)
        for fin in engine.step():
            if fin.error is not None:
                raise RuntimeError(f'bench frame failed: {fin.error}')
            finished.append((fin.request_id, time.perf_counter() - submit_at[fin.request_id],
                             fin.result.stats['accepted_lengths'], len(fin.result.tokens)))
    return finished


def bench_engine(engine: Engine, frames: list[Frame], warmup: int) -> BenchRow:
    """Graph capture (with CUDA graphs), warm-up frames, then the timed frames, both through
    the saturating loop."""
    engine.capture_graphs(frames[0])
    _saturate(engine, frames[:warmup])
    forwards_before = engine.num_verifier_forwards
    stats_before = copy.copy(engine.strategy.stats)
    start = time.perf_counter()
    finished = _saturate(engine, frames[warmup:])
    elapsed = time.perf_counter() - start
    n = len(finished)
    lat = np.array([latency for _, latency, _, _ in finished]) * 1e3
    accepted = [a for _, _, lengths, _ in finished for a in lengths]
    stats = engine.strategy.stats.since(stats_before)
    per_step = stats.per_step_ms()
    return BenchRow(engine.config.mode, n, n / elapsed, float(np.percentile(lat, 50)),
                    float(np.percentile(lat, 99)),
                    (engine.num_verifier_forwards - forwards_before) / max(n, 1),
                    float(np.mean(accepted)) if accepted else NAN,
                    step_ms=per_step['step_ms'], host_ms=per_step['host_ms'],
                    vision_ms=per_step['vision_ms'], verifier_ms=per_step['verifier_ms'],
                    draft_ms=per_step['draft_ms'], draft_host_ms=per_step['draft_host_ms'],
                    steps_per_action=stats.num_steps / max(n, 1),
                    inflight_per_step=stats.num_advanced / stats.num_steps
                    if stats.num_steps else NAN,
                    tokens_per_action=float(np.mean([t for *_, t in finished]))
                    if finished else NAN)


def bench_hf(baseline, frames: list[Frame], warmup: int) -> BenchRow:
    """The family's transformers baseline (baseline.make_baseline) on each frame's image and
    instruction."""
    from .baseline import generate_tokens, timed
    for f in frames[:warmup]:
        generate_tokens(baseline, f.image, f.instruction)
    latencies, lengths = [], []
    start = time.perf_counter()
    for f in frames[warmup:]:
        tokens, dt = timed(baseline, f.image, f.instruction)
        latencies.append(dt)
        lengths.append(len(tokens))
    elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1e3
    n = len(latencies)
    return BenchRow('hf', n, n / elapsed, float(np.percentile(lat, 50)),
                    float(np.percentile(lat, 99)), float('nan'), 1.0,
                    tokens_per_action=float(np.mean(lengths)) if lengths else NAN)


def environment() -> dict:
    import transformers
    return {'python': platform.python_version(), 'torch': torch.__version__,
            'transformers': transformers.__version__, 'machine': platform.machine(),
            'processor': platform.processor() or platform.machine(),
            'cpu_count': torch.get_num_threads(),
            'cuda': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def row_configs(modes: list[str], base_cfg: dict, draft_path: str | None, num_streams: int,
                max_prefills_per_step: int, max_inflight: int | None, tree: dict | None,
                sweep_inflight: list[int] | None) -> list[tuple[str, EngineConfig | None]]:
    """Every row's name and engine config (None: the HF baseline), all built before anything
    is timed, so a bad option is refused at once rather than after the rows before it."""
    rows: list[tuple[str, EngineConfig | None]] = []
    pipelining = {} if max_inflight is None else {'max_inflight': max_inflight}
    for mode in modes:
        rows.append((mode, None if mode == 'hf' else EngineConfig(
            mode=mode, draft_path=draft_path, max_streams=max(4, num_streams),
            max_prefills_per_step=max_prefills_per_step, **pipelining, **base_cfg,
            **(tree or {}))))
    for backend in ('segments', 'dense') if sweep_inflight else ():
        for inflight in sweep_inflight:
            rows.append((f'pipeline {backend} max_inflight={inflight}', EngineConfig(
                mode='pipeline', max_inflight=inflight, attention_backend=backend,
                **base_cfg)))
    return rows


def row_drafters(runner, configs: list[EngineConfig | None]) -> list:
    """Each row's drafter: loaded for a speculative row, None for the others (their engines
    still check the draft path). Done before any row is timed: an Engine refuses a bad
    draft_path in every mode, but only when its row is reached, after the rows before it."""
    from .engine.drafting.draft_choice import check_draft_path, load_draft_for
    for cfg in configs:
        if cfg is not None:
            check_draft_path(cfg.draft_path, runner.checkpoint_folder)
    return [load_draft_for(runner, cfg, runner.checkpoint_folder)
            if cfg is not None and cfg.is_speculative else None for cfg in configs]


def run_bench(model: str, modes: list[str], num_frames: int, warmup: int, device: str,
              dtype: str, seed: int, draft_path: str | None, num_streams: int = 1,
              out_dir: str | None = None, command: str = '', tree: dict | None = None,
              sweep_inflight: list[int] | None = None,
              frame_source: str = 'random', max_prefills_per_step: int = 1,
              max_inflight: int | None = None) -> list[BenchRow]:
    from .baseline import make_baseline
    from .policy import VLAPolicy
    base_cfg = dict(device=device, dtype=dtype, restrict_to_action_tokens=False)
    configs = row_configs(modes, base_cfg, draft_path, num_streams, max_prefills_per_step,
                          max_inflight, tree, sweep_inflight)
    policy = VLAPolicy.from_pretrained(model, **base_cfg)
    runner = policy.engine.runner
    drafters = row_drafters(runner, [cfg for _, cfg in configs])
    frames = make_frames(warmup + num_frames, runner.image_size, seed,
                         policy.unnorm_keys[0], num_streams, frame_source)
    rows: list[BenchRow] = []
    for index, (name, cfg) in enumerate(configs):
        if cfg is None:
            rows.append(bench_hf(make_baseline(runner, policy.config), frames, warmup))
            continue
        drafter, drafters[index] = drafters[index], None      # freed with its row's engine
        engine = Engine(runner, policy.engine.norm_stats, cfg, draft=drafter)
        rows.append(bench_engine(engine, frames, warmup))
        rows[-1].mode = name
        del engine, drafter
    hf = next((r for r in rows if r.mode == 'hf'), None)
    if hf is not None:
        for r in rows:
            r.ratio_vs_hf = r.actions_per_s / hf.actions_per_s
            r.latency_ratio_vs_hf = r.latency_p50_ms / hf.latency_p50_ms
    if out_dir:
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime('%Y%m%d-%H%M%S')
        record = {'command': command, 'model': model, 'device': device, 'dtype': dtype,
                  'num_frames': num_frames, 'warmup': warmup, 'num_streams': num_streams,
                  'frame_source': frame_source,
                  'max_prefills_per_step': max_prefills_per_step,
                  'max_inflight': max_inflight or EngineConfig().max_inflight,
                  'tree': tree or {}, 'environment': environment(),
                  'rows': [asdict(r) for r in rows]}
        (path / f'bench-{stamp}.json').write_text(json.dumps(record, indent=2))
        (path / f'bench-{stamp}.md').write_text(format_table(rows, record))
    return rows


def format_table(rows: list[BenchRow], record: dict | None = None) -> str:
    lines = []
    if record:
        env = record['environment']
        lines += [f"command: `{record['command']}`",
                  f"model {record['model']}, device {record['device']} "
                  f"({env['cuda'] or env['processor']}, {env['cpu_count']} threads), "
                  f"dtype {record['dtype']}, torch {env['torch']}, transformers "
                  f"{env['transformers']}, {record['num_frames']} frames, "
                  f"{record['num_streams']} stream(s), up to "
                  f"{record.get('max_prefills_per_step', 1)} prefill(s) per step, "
                  f"max_inflight {record.get('max_inflight', 7)}", '']
    lines.append('| mode | actions/s | ×HF | latency p50 ms | p99 ms | p50 ×HF | '
                 'forwards/action | acceptance length | ms/step | host ms/step | '
                 'vision / verifier / draft ms/step | draft host ms/step | in flight/step | '
                 'tokens/action |')
    lines.append('|' + '---|' * 14)
    for r in rows:
        lines.append(f'| {r.mode} | {r.actions_per_s:.2f} | {r.ratio_vs_hf:.2f} | '
                     f'{r.latency_p50_ms:.1f} | {r.latency_p99_ms:.1f} | '
                     f'{r.latency_ratio_vs_hf:.2f} | {r.forwards_per_action:.2f} | '
                     f'{r.acceptance_length:.2f} | {r.step_ms:.2f} | {r.host_ms:.2f} | '
                     f'{r.vision_ms:.2f} / {r.verifier_ms:.2f} / {r.draft_ms:.2f} | '
                     f'{r.draft_host_ms:.2f} | {r.inflight_per_step:.2f} | '
                     f'{r.tokens_per_action:.1f} |')
    return '\n'.join(lines) + '\n'
