"""The demo's report, from its record (the JSON `vla-spec demo` writes): every part's table
(demo_tables.py) in the order a reader wants them, each with its caption, and the closing
summary (the default configuration against AR and the Hugging Face baseline at the camera rate,
and where each lands on the delay curve, demo_placement.py). Used for the printed report, the
Markdown file and `--report` re-rendering.

Contracts: pure functions of the record; `format_report` leaves out a part the record lacks,
`format_summary` is empty without a stream part.
"""
from __future__ import annotations

from vla_spec_ros.harness.demo_placement import (measured, mode_label, model_curves,
                                                 reference_placements, stream_placements)
from vla_spec_ros.harness.demo_tables import (REFERENCE_7B_TITLE, WHERE_MODEL, episodes, fmt,
                                              format_delay_table, format_lockstep_table,
                                              format_realtime_table, format_relax_table,
                                              format_speed_table, format_stream_table,
                                              format_task_table, stream_rows)


# Below this share of its frames answered, AR falls behind the camera (frames wait for the one
# before them), and the caption says what the ×AR column then measures.
AR_KEEPS_UP_FRACTION = 0.95


def _stream_caption(record: dict) -> str:
    stream = record['stream']
    loads = [r['load_avg_1m'] for r in stream['rows'] if r.get('load_avg_1m')]
    held = sum((r.get('node') or {}).get('holds', 0) for r in stream['rows'])
    text = (f"A camera publishing at {stream['rate_hz']:g} Hz for {stream['seconds']:g} s per "
            f"mode ({stream['num_frames']} timed frames after a {stream['warmup_s']:g} s "
            f"warm-up): {stream['frames']}. The node keeps the newest frame and drops those it "
            'had no time for; each twist carries its image\'s stamp, so latency is image '
            'published -> its twist received (both in this process, DDS in between). '
            f"max_action_age {stream['max_action_age_s']:g} s ({held} hold(s)). The Hugging "
            'Face baseline is not a node mode: measured model only, same frames and rate.')
    if loads:
        text += (' Load average (1 min) during the rows: '
                 f"{min(min(x) for x in loads):.1f}-{max(max(x) for x in loads):.1f} on "
                 f"{record['machine'].get('cpu_count', '?')} cores.")
    ar, _ = stream_rows(record)
    answered = measured(ar['answered_fraction']) if ar is not None else float('nan')
    if answered < AR_KEEPS_UP_FRACTION:
        text += (f' AR answered {100 * answered:.0f}% of the frames: it falls behind the '
                 'camera on this machine, so its latency includes frames waiting for the one '
                 'before them, and the ×AR column measures keeping up with the camera as much '
                 'as the time a frame takes.')
    return text + '\n'


def realtime_caption(record: dict) -> str:
    lock = record['lockstep']
    return (f"Real time at {lock['control_rate_hz']:g} Hz: the bridge steps the arm on its timer "
            'with the newest command (zero motion when none is younger than its timeout: stale '
            'commands; hold commands: steps with a zero twist the node published as a hold, '
            'e.g. no image yet or a chunk that ran out). Camera '
            'delay d: the frame rendered at period t is published at t + d with its capture '
            'stamp, so a single-step action lands at least d periods late and the node '
            'executes a chunk time-aligned by the stamp (its first d steps skipped). Latency: '
            'frame published -> its first command received by the bridge (the camera delay '
            'not included). Lag of an applied answer: the period of the state it was applied '
            'to minus (its frame\'s period + its chunk step), 0 = time-aligned; on time: lag '
            '0. Late ticks: more than 1.5 periods after the previous one. Chunk '
            'steps, run-outs and refused chunks (did not decode; the kept chunk went on, '
            'invalid_chunk: continue) are the node\'s counters while episodes ran.\n')


def _stream_cell(row: dict, ar: dict | None) -> str:
    text = (f"p50 {fmt(row['latency_p50_ms'], 1)} ms, p99 {fmt(row['latency_p99_ms'], 1)} ms, "
            f"{fmt(row['actions_per_s'], 1)} actions/s, "
            f"{100 * measured(row['answered_fraction']):.0f}% of frames answered")
    if ar is not None and row is not ar:
        ratio = measured(row['latency_p50_ms']) / measured(ar['latency_p50_ms'])
        text += f' (p50 ×{fmt(ratio)} AR\'s)'
    return text


def format_summary(record: dict) -> str:
    """The closing lines: the default configuration against AR and the Hugging Face baseline
    at the camera rate, and where each lands on the delay curve ('' without a stream part)."""
    ar, rows = stream_rows(record)
    if not rows:
        return ''
    stream = record['stream']
    default = next((r for r in rows if r.get('is_default')), None)
    hf = next((r for r in rows if r['mode'] == 'hf'), None)
    lines = [f"Summary, camera at {stream['rate_hz']:g} Hz, consecutive control steps:"]
    if default is not None:
        lines.append(f'- default configuration, {mode_label(default)}, r = 0, on the ROS 2 '
                     f'node: {_stream_cell(default, ar)}')
    else:
        lines.append('- the default configuration was not run (see --modes, --draft-path)')
    if ar is not None:
        lines.append(f'- ar on the ROS 2 node: {_stream_cell(ar, None)}')
    if hf is not None:
        lines.append(f'- Hugging Face baseline, {WHERE_MODEL}: {_stream_cell(hf, ar)}')
    spots = sorted((p for p in stream_placements(record)
                    if p['is_default'] or p['mode'] in ('ar', 'hf')),
                   key=lambda p: (not p['is_default'], p['mode'] != 'ar'))
    if spots:
        lines.append('- on the delay curve (success at d periods late): ' + ', '.join(
            f"{'default' if p['is_default'] else p['mode']} d = {p['delay']} "
            f"({p['mark']}{fmt(p['success'])})" for p in spots))
    reference = reference_placements(record)
    if reference:
        lines.append(f'- OpenVLA-7B ({REFERENCE_7B_TITLE}): ' + ', '.join(
            f"{p['label']} {fmt(p['latency_p50_ms'], 0)} ms, d = {p['delay']} "
            f"({p['mark']}{fmt(p['success'])})" for p in reference))
    return '\n'.join(lines) + '\n'


def format_report(record: dict) -> str:
    """Every table of a run, in the order a reader wants them."""
    tasks = record['tasks']
    out = []
    if 'stream' in record:
        out += [f"## Streaming: the ROS 2 node fed by a camera at "
                f"{record['stream']['rate_hz']:g} Hz (the speed measurement)\n",
                format_stream_table(record), _stream_caption(record)]
    if 'lockstep' in record and record['lockstep'].get('sim_mode') == 'realtime':
        lock = record['lockstep']
        out += [f"## Real time through the ROS 2 node and the simulator bridge "
                f"({episodes(lock['episodes'])} per task and row): success\n",
                format_realtime_table(record), realtime_caption(record)]
    elif 'lockstep' in record:
        lock = record['lockstep']
        out += [f"## Lock-step through the ROS 2 node and the simulator bridge "
                f"({episodes(lock['episodes'])} per task and mode): success\n",
                format_lockstep_table(record),
                'Lock-step has no camera: the next frame exists only once the previous action '
                'was applied, so one frame is in flight and pipelining has nothing to overlap; '
                'this table measures success (and that the strict modes follow AR), not speed '
                '(the streaming table is the speed measurement). steps/s: the whole loop, '
                'rendering and DDS included (simulator-bound); node actions/s: 1 / mean frame '
                '-> command latency; model-only actions/s: the speed table below.\n',
                format_task_table(lock['rows'], tasks,
                                  lambda r: f"{r['mode']} r={r['relax_threshold']}")]
    if 'speed' in record:
        speed = record['speed']
        source = speed.get('bench_frame_source', 'random')
        out += ['## Model only (no ROS, no simulator)\n', format_speed_table(record),
                f"`vla-spec bench --frames-from {source}` workload ({speed['bench_frames']} "
                'frames, a camera faster than inference) for actions/s, × HF (the Hugging Face '
                'AR baseline, same run), the saturated latency, verifier forwards and generated '
                'tokens per action (a FAST chunk\'s count varies); the @ Hz columns feed '
                + (speed.get('paced_frames', 'Meta-World frames') + ' ')
                + 'at that camera rate the way the node does (the newest frame replaces a '
                'waiting one).\n']
    if 'delay' in record:
        out += ['## Success against action delay (delayed lock-step, AR actions)\n',
                format_delay_table(record)]
        curves = model_curves(record)
        if len(curves) > 1:
            for (label, _), entry in zip(curves, record['delay']['models']):
                out += [f'Success per task, {label}:\n', format_task_table(
                    entry['points'], tasks, lambda p: p['label'])]
    if 'relax' in record:
        out += ['## Relaxed acceptance: the trade-off\n', format_relax_table(record)]
    summary = format_summary(record)
    if summary:
        out += ['## Summary\n', summary]
    return '\n'.join(out)


__all__ = ['format_report', 'format_summary', 'realtime_caption']
