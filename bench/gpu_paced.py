"""The paced part of bench/gpu.py (``--parts paced``): several robots on one engine, each camera
at a fixed rate (paced, not saturating), the engine stepping as the node's worker does.

The cameras and the serving loop are the demo's (``harness.speed.paced_streams``): each robot's
camera captures a frame every ``1 / camera_hz`` seconds, offset evenly within a period; its
newest frame replaces the one it still has waiting, in that frame's place in the queue, as on
the node; latency runs from capture to action.

Per row and robot: frames captured, share answered, p50 / p99 / max latency. The row's verdict
columns are the least-answered robot and the worst latencies among the robots answered at all
(``robots_unanswered`` counts the others: a starved robot shows there and as 0 % answered).
"""
from __future__ import annotations

from gpu_setup import (EPISODE_RUN, TEMPORAL_REPEATS, build_runner, engine_options,
                       episode_like_frames, graphs_setting, repeated_frames, time_pieces)
from vla_spec_ros.bench import make_frames
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.harness.speed import paced_streams


def run_paced(engine: Engine, frames_by_robot: list[list[Frame]], camera_hz: float,
              warmup_frames: int) -> dict:
    """Graphs for every prompt length first (no capture once the clock runs), then every
    robot's frames at ``camera_hz`` through ``engine`` (``harness.speed.paced_streams``);
    the first ``warmup_frames`` of each robot are served but not counted. Returns the per-robot
    summaries and the row's verdicts (``summarize``)."""
    first_of_instruction = {}
    for frames in frames_by_robot:
        for frame in frames:
            first_of_instruction.setdefault(frame.instruction, frame)
    for frame in first_of_instruction.values():
        engine.capture_graphs(frame)
    robots = paced_streams(engine, frames_by_robot, camera_hz, warmup_frames)
    return {'camera_hz': camera_hz, **summarize(robots)}


def summarize(robots: list[dict]) -> dict:
    """The per-robot summaries and the row's verdicts: the least-answered robot, the worst
    latencies among the robots answered at all (a robot with no answer has NaN latencies,
    which would make a plain max depend on the robots' order) and how many robots got no
    answer."""
    answered = [r for r in robots if r['num_answered']]

    def worst(key):
        return max(r[key] for r in answered) if answered else float('nan')
    return {'robots': robots, 'least_answered': min(r['answered_fraction'] for r in robots),
            'robots_unanswered': len(robots) - len(answered),
            'worst_p50_ms': worst('latency_p50_ms'), 'worst_p99_ms': worst('latency_p99_ms'),
            'oldest_ms': worst('latency_max_ms')}


def frames_per_robot(frames: list[Frame], num_robots: int) -> list[list[Frame]]:
    """Frame i of ``frames`` belongs to robot i % num_robots (make_frames' stream order)."""
    return [frames[r::num_robots] for r in range(num_robots)]


def paced_rows(robot_counts: list[int], prefill_settings: list[int]) -> list[tuple]:
    """(label, mode, robots, prefills, frame kind) of every paced row: per robot count AR and
    the default configuration (pipeline_spec drafting the previous action, speculative
    prefill) at each prefill setting up to the robot count, on episode-like frames; for one
    robot also spec and pipeline_spec on frames that repeat (a robot holding still: one
    forward per action is the floor), for several the default on frames that repeat at the
    largest prefill setting (how many robots fit when the draft is right)."""
    rows = []
    for robots in robot_counts:
        rows.append(('ar', 'ar', robots, 1, 'episode-like'))
        rows += [('default (pipeline_spec)', 'pipeline_spec', robots, p, 'episode-like')
                 for p in prefill_settings if p <= robots]
        if robots == 1:
            rows += [(f'{mode}, frames that repeat', mode, 1, 1, 'repeat')
                     for mode in ('spec', 'pipeline_spec')]
        else:          # what the drafter buys several robots: all prefills settings' largest
            rows.append(('default, frames that repeat', 'pipeline_spec', robots,
                         max(p for p in prefill_settings if p <= robots), 'repeat'))
    return rows


def run_paced_part(args, weights, key, on_progress=lambda paced: None) -> dict:
    """Every paced row (CUDA graphs as the last ``--graphs`` setting) and, measured in the same
    run, one robot's floor: the vision towers with the prompt, plus one prefill forward.
    ``on_progress`` gets the part so far after every row (the progress file)."""
    options = engine_options(args, graphs_setting(args, -1))
    runner = build_runner(weights, options)
    size = weights.cfg.image_size
    pieces = time_pieces(runner, make_frames(2, size, 3, key), options)
    floor_ms = pieces['vision+prompt'] + pieces['prefill']
    print(f'paced part: vision+prompt {pieces["vision+prompt"]:.2f} ms + prefill '
          f'{pieces["prefill"]:.2f} ms = one robot\'s floor {floor_ms:.2f} ms', flush=True)
    per_robot = args.paced_warmup_frames + int(round(args.camera_hz * args.paced_seconds))
    rows = []
    robot_counts = [int(n) for n in args.paced_robots.split(',')]
    prefill_settings = [int(p) for p in args.paced_prefills.split(',')]
    for label, mode, robots, prefills, kind in paced_rows(robot_counts, prefill_settings):
        frames = make_frames(per_robot * robots, size, args.seed, key, robots)
        frames = repeated_frames(frames, robots, TEMPORAL_REPEATS) if kind == 'repeat' \
            else episode_like_frames(frames, robots, EPISODE_RUN)
        row = {'label': label, 'mode': mode, 'robots_n': robots, 'prefills': prefills,
               'frames': kind}
        try:
            engine = Engine(runner, weights.norm_stats,
                            EngineConfig(mode=mode, max_prefills_per_step=prefills,
                                         max_streams=max(robots, 1), **options))
            row.update(run_paced(engine, frames_per_robot(frames, robots), args.camera_hz,
                                 args.paced_warmup_frames))
            row['p50_over_floor'] = row['worst_p50_ms'] / floor_ms
            del engine
        except Exception as exc:    # noqa: BLE001 - recorded in the row
            row['error'] = f'{type(exc).__name__}: {exc}'
        print('paced', row, flush=True)
        rows.append(row)
        on_progress({'pieces_ms': pieces, 'floor_ms': floor_ms, 'rows': rows})
    return {'pieces_ms': pieces, 'floor_ms': floor_ms, 'rows': rows}


def format_paced(rows: list[dict]) -> str:
    lines = ['| row | frames | robots | prefills/step | camera Hz | least answered | '
             'worst p50 ms | p50 / floor | worst p99 ms | oldest ms | '
             'per robot answered / p50 / p99 |', '|---|---|---|---|---|---|---|---|---|---|---|']
    for row in rows:
        if 'error' in row:
            lines.append(f'| {row["label"]} | {row["frames"]} | {row["robots_n"]} | '
                         f'{row["prefills"]} | | failed: {row["error"]} | | | | | |')
            continue
        per_robot = '; '.join(f'{r["answered_fraction"]:.0%} / {r["latency_p50_ms"]:.1f} / '
                              f'{r["latency_p99_ms"]:.1f}' for r in row['robots'])
        lines.append(f'| {row["label"]} | {row["frames"]} | {row["robots_n"]} | '
                     f'{row["prefills"]} | {row["camera_hz"]:g} | {row["least_answered"]:.1%} | '
                     f'{row["worst_p50_ms"]:.1f} | {row["p50_over_floor"]:.2f} | '
                     f'{row["worst_p99_ms"]:.1f} | '
                     f'{row["oldest_ms"]:.1f} | {per_robot} |')
    return '\n'.join(lines)
