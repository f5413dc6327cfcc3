"""Which draft predicts a chunk codec's tokens (FAST): each candidate drafter measured on
held-out consecutive Meta-World control steps, against AR and the Hugging Face baseline.

    python3 bench/fast_drafts.py [--model metaworld-demo-fast] [--frames 60] [--warmup 4]
        [--strides 1,4] [--drafts previous_action,shifted_chunk,shifted_chunk_linear]
        [--modes spec,pipeline_spec] [--frames-from metaworld-episodes] [--out DIR]

Frames: one robot's camera (``sim.frames.episode_frames``: runs of consecutive control steps
of the expert's path, the six tasks in turn, held-out seeds), each frame carrying its control
step. ``--strides k``: the camera's frames every k control steps (a policy that answers every
k steps; the shifted drafts shift by k). Per candidate draft and mode (through
``bench.bench_engine``, the saturating one-camera loop): tokens accepted per verifier forward
(generated tokens / verifier forwards), verifier forwards per chunk, tokens per chunk, ms per
chunk (wall time / chunks) and latency p50; AR and HF (transformers ``generate``) beside them.
Writes ``fast_drafts-<stamp>.{json,md}`` under ``--out`` with the command.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vla_spec_ros.bench import (FRAME_SOURCES, bench_engine, bench_hf,  # noqa: E402
                                environment, make_frames)
from vla_spec_ros.config import EngineConfig  # noqa: E402
from vla_spec_ros.engine.engine import Engine  # noqa: E402

DRAFTS = ('previous_action', 'shifted_chunk', 'shifted_chunk_linear')
OUT = ROOT / 'bench' / 'results' / 'fast_drafts'


def strided(frames, stride: int):
    """Every ``stride``-th frame of each run of consecutive control steps (a run starts where
    the step does not follow its predecessor's), keeping each frame's control step."""
    if stride == 1:
        return list(frames)
    out, run_start = [], None
    for i, frame in enumerate(frames):
        step = frame.control_step
        previous = frames[i - 1].control_step if i else None
        if step is None or previous is None or step != previous + 1:
            run_start = step
        if step is None or (step - run_start) % stride == 0:
            out.append(frame)
    return out


def row_dict(row, draft: str, stride: int) -> dict:
    """A ``BenchRow`` with the draft's numbers: ``acceptance_length`` is the tokens a frame
    decides per verifier forward it takes part in (prefill included), pooled over all of them,
    so a frame's own forwards are tokens per chunk / acceptance_length; ``forwards_per_action``
    counts packed forwards (one forward advances every frame in flight)."""
    record = asdict(row)
    record.update(draft=draft, stride=stride,
                  frame_forwards_per_chunk=row.tokens_per_action / row.acceptance_length,
                  ms_per_chunk=1e3 / row.actions_per_s)
    return record


def measure(model: str, drafts, modes, num_frames: int, warmup: int, strides, seed: int,
            frame_source: str, device: str = 'cpu', dtype: str = 'float32',
            with_hf: bool = True, per_stream_caps=(None,)) -> list[dict]:
    """`per_stream_caps`: the pipeline modes' `max_inflight_per_stream` values to run
    (None: the engine's default); the other modes run once."""
    from vla_spec_ros.baseline import make_baseline
    from vla_spec_ros.policy import VLAPolicy
    base = dict(device=device, dtype=dtype, restrict_to_action_tokens=False)
    policy = VLAPolicy.from_pretrained(model, **base)
    runner = policy.engine.runner
    key = policy.unnorm_keys[0]
    rows = []
    for stride in strides:
        frames = strided(make_frames((warmup + num_frames) * stride, runner.image_size, seed,
                                     key, 1, frame_source), stride)[:warmup + num_frames]
        if with_hf:
            rows.append(row_dict(bench_hf(make_baseline(runner, policy.config), frames,
                                          warmup), '-', stride))
        runs = [(mode, '-') for mode in ['ar', *[m for m in ('pipeline',) if m in modes]]]
        runs += [(mode, draft) for draft in drafts
                 for mode in modes if mode in ('spec', 'pipeline_spec')]
        for mode, draft in runs:
            pipelined = mode in ('pipeline', 'pipeline_spec')
            for cap in (per_stream_caps if pipelined else (None,)):
                cfg = EngineConfig(mode=mode, **base,
                                   **({} if draft == '-' else {'draft_path': draft}),
                                   **({} if cap is None else {'max_inflight_per_stream': cap}))
                row = row_dict(bench_engine(Engine(runner, policy.engine.norm_stats, cfg),
                                            frames, warmup), draft, stride)
                # one camera: its frames in flight at once
                row['max_inflight'] = cfg.stream_inflight_limit
                rows.append(row)
    return rows


COLUMNS = (('stride', 'stride', '{}'), ('mode', 'mode', '{}'), ('draft', 'draft', '{}'),
           ('max_inflight', 'frames in flight (max)', '{}'),
           ('acceptance_length', 'tokens / verifier fwd', '{:.2f}'),
           ('frame_forwards_per_chunk', 'verifier fwd / chunk', '{:.2f}'),
           ('forwards_per_action', 'packed fwd / chunk', '{:.2f}'),
           ('tokens_per_action', 'tokens / chunk', '{:.1f}'),
           ('ms_per_chunk', 'ms / chunk', '{:.1f}'), ('latency_p50_ms', 'p50 ms', '{:.1f}'),
           ('ratio_vs_hf', 'chunks/s vs HF', '{:.2f}'),
           ('latency_ratio_vs_hf', 'p50 vs HF', '{:.2f}'))


def format_table(rows: list[dict]) -> str:
    hf = {r['stride']: r for r in rows if r['mode'] == 'hf'}
    lines = ['| ' + ' | '.join(title for _, title, _ in COLUMNS) + ' |',
             '|' + '---|' * len(COLUMNS)]
    for r in rows:
        base = hf.get(r['stride'])
        if base is not None:
            r = dict(r, ratio_vs_hf=base['ms_per_chunk'] / r['ms_per_chunk'],
                     latency_ratio_vs_hf=r['latency_p50_ms'] / base['latency_p50_ms'])
        cells = []
        for key, _, fmt in COLUMNS:
            value = r.get(key, float('nan'))
            cells.append('-' if isinstance(value, float) and value != value
                         else fmt.format(value))
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='metaworld-demo-fast')
    p.add_argument('--frames', type=int, default=60, help='timed frames per stride')
    p.add_argument('--warmup', type=int, default=4)
    p.add_argument('--strides', default='1,4')
    p.add_argument('--drafts', default=','.join(DRAFTS))
    p.add_argument('--modes', default='spec,pipeline_spec')
    p.add_argument('--frames-from', default='metaworld-episodes', choices=FRAME_SOURCES)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--no-hf', action='store_true')
    p.add_argument('--per-stream', default='default', metavar='N,M',
                   help="the pipeline modes' max_inflight_per_stream values to run "
                        "('default': the engine's)")
    p.add_argument('--out', default=str(OUT))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    strides = [int(s) for s in args.strides.split(',')]
    rows = measure(args.model, args.drafts.split(','), args.modes.split(','), args.frames,
                   args.warmup, strides, args.seed, args.frames_from, with_hf=not args.no_hf,
                   per_stream_caps=[None if c == 'default' else int(c)
                                    for c in args.per_stream.split(',')])
    command = 'python3 bench/fast_drafts.py ' + ' '.join(shlex.quote(a) for a in argv)
    table = format_table(rows)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime('%Y%m%d-%H%M%S')
        env = environment()
        record = {'command': command, 'model': args.model, 'frames': args.frames,
                  'warmup': args.warmup, 'frame_source': args.frames_from, 'seed': args.seed,
                  'environment': env, 'rows': rows}
        (out / f'fast_drafts-{stamp}.json').write_text(json.dumps(record, indent=2))
        (out / f'fast_drafts-{stamp}.md').write_text(
            f'command: `{command}`\n\nmodel {args.model}, {args.frames} frames after '
            f'{args.warmup} warm-up, {args.frames_from}, torch {env["torch"]}, '
            f'{env["processor"]} {env["cpu_count"]} threads\n\n' + table)
        print(f'wrote {out}/fast_drafts-{stamp}.md')
    return 0


if __name__ == '__main__':
    sys.exit(main())


__all__ = ['DRAFTS', 'format_table', 'measure', 'strided']
