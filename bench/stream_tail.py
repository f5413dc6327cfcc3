"""Where a streamed frame's latency goes: the demo's 30 Hz stream through the real node, with
every frame's engine record beside its latency, so the slowest frames can be explained.

For each mode (interleaved over --rounds), the frames of harness/streaming.stream_frames are
published at --rate to a VLASpecNode (harness/streaming.run_stream_mode) while the engine's
`finish` is observed. Per answered frame:

  latency      image published -> its first twist received (the demo's number)
  engine       Engine.submit -> its result finished (waiting + compute)
  compute      its prefill started -> finished
  wait         submitted -> prefill started (another frame was being stepped)
  outside      latency - engine: conversion, the worker's turn, the chunk logic, DDS
  before       image published -> submitted, in stages: dds_in (published -> the node's
               image callback), slot (-> the worker took it), convert (-> converted),
               to_submit (-> Engine.submit)
  after        finished -> its twist received (the chunk logic, the outputs, DDS)
  forwards     verifier forwards the frame took part in
  overlap      whether another frame of the robot was in flight when it started
  gc_ms        Python's garbage-collector pauses inside the frame's latency

It prints p50 / p99 of each column per mode, and the slowest frames (the top 2 %) with their
attribution, then writes the whole table as JSON (--out).

    python3 bench/stream_tail.py --model metaworld-demo-fast --modes ar,pipeline_spec \
        --seconds 10 --rounds 2 --out bench/results/demo_fast
"""
from __future__ import annotations

import argparse
import gc
import os
import pathlib
import sys
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class EngineRecorder:
    """Wraps `engine.finish` and `engine.step` of one policy: each finished frame's stamp,
    timings and forwards; each step's wall span (for overlap)."""

    def __init__(self, engine):
        self.engine = engine
        self.frames = {}            # stamp -> record
        self._lock = threading.Lock()
        self._finish = engine.finish
        engine.finish = self._on_finish

    def _on_finish(self, request):
        finished = self._finish(request)
        stats = finished.result.stats if finished.result is not None else {}
        info = finished.frame.user_data
        stamp = getattr(info, 'stamp', None)
        if stamp is not None:
            key = (stamp.sec, stamp.nanosec) if hasattr(stamp, 'sec') else tuple(stamp)
            with self._lock:
                self.frames[key] = {
                    'submit': request.submit_time,
                    'start': request.start_time or request.submit_time,
                    'end': time.perf_counter(),
                    'forwards': int(stats.get('forward_passes', 0)),
                    'tokens': int(stats.get('num_tokens', 0)),
                    'prefill_accepted': int(stats.get('prefill_accepted') or 0),
                    'valid': bool(finished.result is not None and finished.result.is_valid),
                    # the node's own stage times (time.monotonic, the clock of perf_counter
                    # on Linux): image received, taken by the worker, converted
                    'receipt': getattr(info, 'receipt_mono', float('nan')),
                    'taken': getattr(info, 'taken_mono', float('nan')),
                    'converted': getattr(info, 'converted_mono', float('nan'))}
        return finished

    def restore(self):
        self.engine.finish = self._finish


class GcPauses:
    """Wall spans of the collector's runs (gc.callbacks), while installed."""

    def __init__(self):
        self.spans, self._start = [], None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == 'start':
            self._start = time.perf_counter()
        elif self._start is not None:
            self.spans.append((self._start, time.perf_counter(), info.get('generation')))
            self._start = None

    def within(self, t0, t1) -> float:
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b, _ in self.spans)

    def close(self):
        gc.callbacks.remove(self._callback)


def frame_table(trace, recorder, pauses, chunk_steps, period_s):
    """One row per answered timed frame (see the module's docstring)."""
    from vla_spec_ros.harness.streaming import answered_stamp

    published = trace['published']
    known = set(published) | set(trace['warmup'])
    first = {}
    for stamp, received, _ in trace['answers']:
        image = answered_stamp(stamp, known, chunk_steps, period_s)
        if image in published and image not in first:
            first[image] = received
    records = recorder.frames
    spans = sorted((r['start'], r['end']) for r in records.values())
    rows = []
    for image, received in sorted(first.items()):
        sent = published[image]
        rec = records.get(image)
        row = {'stamp': image, 'latency_ms': 1e3 * (received - sent)}
        if rec is not None:
            row.update(engine_ms=1e3 * (rec['end'] - rec['submit']),
                       compute_ms=1e3 * (rec['end'] - rec['start']),
                       wait_ms=1e3 * (rec['start'] - rec['submit']),
                       outside_ms=1e3 * (received - sent - (rec['end'] - rec['submit'])),
                       before_ms=1e3 * (rec['submit'] - sent),
                       dds_in_ms=1e3 * (rec['receipt'] - sent),
                       slot_ms=1e3 * (rec['taken'] - rec['receipt']),
                       convert_ms=1e3 * (rec['converted'] - rec['taken']),
                       to_submit_ms=1e3 * (rec['submit'] - rec['converted']),
                       after_ms=1e3 * (received - rec['end']),
                       forwards=rec['forwards'], tokens=rec['tokens'],
                       overlap=any(s < rec['start'] < e and (s, e) != (rec['start'], rec['end'])
                                   for s, e in spans),
                       gc_ms=1e3 * pauses.within(sent, received))
        rows.append(row)
    return rows


def summarize(rows, mode):
    keys = ('latency_ms', 'engine_ms', 'wait_ms', 'compute_ms', 'outside_ms', 'before_ms',
            'dds_in_ms', 'slot_ms', 'convert_ms', 'to_submit_ms', 'after_ms', 'forwards',
            'gc_ms')
    lines = [f'## {mode}: {len(rows)} frames answered', '',
             '| column | p50 | p99 | max |', '|---|---|---|---|']
    for key in keys:
        values = np.array([r[key] for r in rows if key in r], dtype=float)
        if len(values):
            lines.append(f'| {key} | {np.percentile(values, 50):.1f} | '
                         f'{np.percentile(values, 99):.1f} | {values.max():.1f} |')
    overlap = [r for r in rows if r.get('overlap')]
    lines.append(f'\nframes started while another of the robot was in flight: {len(overlap)}'
                 f' ({100 * len(overlap) / max(1, len(rows)):.0f} %)')
    slow = sorted(rows, key=lambda r: -r['latency_ms'])[:max(3, len(rows) // 50)]
    lines += ['', 'slowest frames:', '',
              '| latency | engine | wait | compute | outside | forwards | tokens | overlap '
              '| gc ms |', '|---|---|---|---|---|---|---|---|---|']
    for r in slow:
        lines.append(f"| {r['latency_ms']:.1f} | {r.get('engine_ms', float('nan')):.1f} | "
                     f"{r.get('wait_ms', float('nan')):.1f} | "
                     f"{r.get('compute_ms', float('nan')):.1f} | "
                     f"{r.get('outside_ms', float('nan')):.1f} | {r.get('forwards', '-')} | "
                     f"{r.get('tokens', '-')} | {r.get('overlap', '-')} | "
                     f"{r.get('gc_ms', float('nan')):.1f} |")
    return '\n'.join(lines)


def split_node_parameters(options: dict) -> dict:
    """Take a row's node.NAME options out of `options` (the rest are the policy's):
    {NAME: value}."""
    names = [name for name in options if name.startswith('node.')]
    return {name[len('node.'):]: options.pop(name) for name in names}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='metaworld-demo-fast')
    parser.add_argument('--modes', default='ar,pipeline_spec',
                        help='comma-separated rows: a mode, or label=mode:option=value:... with '
                             'EngineConfig options (e.g. ps1=pipeline_spec:'
                             'max_inflight_per_stream=1) and node parameters named node.NAME '
                             '(e.g. t2=pipeline_spec:node.torch_threads=2)')
    parser.add_argument('--rate', type=float, default=30.0)
    parser.add_argument('--seconds', type=float, default=10.0)
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--seed', type=int, default=3000)
    parser.add_argument('--tasks', default=None, help='comma-separated (default: the demo\'s)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', default=None, help='folder for the JSON and the table')
    args = parser.parse_args(argv)

    import torch

    from records import parse_row, write_record      # bench/, beside this script

    from vla_spec_ros.harness import streaming
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.ros.model_io import chunk_steps_of
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    torch.set_num_threads(args.threads)
    tasks = args.tasks.split(',') if args.tasks else list(DEFAULT_TASK_NAMES)
    rows_wanted = dict(parse_row(text) for text in args.modes.split(','))
    modes = list(rows_wanted)
    node_parameters = {label: split_node_parameters(options)
                       for label, options in rows_wanted.items()}
    policies = {label: VLAPolicy.from_pretrained(args.model, **options)
                for label, options in rows_wanted.items()}
    any_policy = next(iter(policies.values()))
    unnorm_key = _resolve_unnorm_key(any_policy, None)
    num_warmup, num_timed = streaming.frame_counts(args.rate, args.seconds)
    frames = streaming.stream_frames(tasks, num_warmup + num_timed,
                                     any_policy.model_config.image_size, args.seed, unnorm_key)
    results = {mode: [] for mode in modes}
    for round_index in range(args.rounds):
        for mode in modes:
            policy = policies[mode]
            recorder, pauses, trace = EngineRecorder(policy.engine), GcPauses(), {}
            try:
                summary = streaming.run_stream_mode(policy, frames, args.rate, num_warmup,
                                                    unnorm_key, trace=trace,
                                                    log_level='error',
                                                    node_parameters=node_parameters[mode])
            finally:
                recorder.restore()
                pauses.close()
            rows = frame_table(trace, recorder, pauses, chunk_steps_of(policy),
                               1.0 / args.rate)
            results[mode].append({'round': round_index, 'summary': summary, 'rows': rows})
            print(f'round {round_index} {mode}: p50 {summary["latency_p50_ms"]:.1f} ms, p99 '
                  f'{summary["latency_p99_ms"]:.1f} ms, answered '
                  f'{summary["num_answered"]}/{summary["num_frames"]}, load '
                  f'{os.getloadavg()[0]:.2f}', flush=True)
    given = sys.argv[1:] if argv is None else argv
    command = 'python3 bench/stream_tail.py ' + ' '.join(given)
    report = [f'# Where the stream\'s latency goes ({time.strftime("%Y-%m-%d %H:%M:%S")})', '',
              f'command: `{command}`', '']
    for mode in modes:
        rows = [r for run in results[mode] for r in run['rows']]
        report.append(summarize(rows, mode))
        report.append('')
    text = '\n'.join(report)
    print(text)
    if args.out:
        write_record(args.out, 'stream_tail', text, {'command': command, 'results': results})


if __name__ == '__main__':
    main()
