"""The demo's tables, one per part, from its record (the JSON `vla-spec demo` writes):
streaming, lock-step (or real time), model-only speed, success per task, the delay curve with
where each mode's latency lands on it (demo_placement.py), and the relaxation trade-off.

Contracts: pure functions of the record returning Markdown tables (a delay table carries its
notes); a value not measured (JSON null or NaN) shows as '-'. `fmt`, `episodes` and
`stream_rows` are shared with demo_report.py, which puts the tables in order.
"""
from __future__ import annotations

import math

from vla_spec_ros.harness.demo_placement import (KEEPS_UP_FRACTION, delay_curve, measured,
                                                 mode_label, model_curves, placements,
                                                 reference_placements, stream_placements)

# streaming.WHERE_MODEL (this module imports nothing of the harness that needs ROS or torch).
WHERE_MODEL = 'model only (not on the node)'
REFERENCE_7B_TITLE = 'recorded on an H100, OpenVLA-7B shape, not measured by this demo'


def fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    return f'{value:.{digits}f}'


def episodes(count: int) -> str:
    return f'{count} episode' + ('' if count == 1 else 's')


def markdown_table(head, rows) -> str:
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines) + '\n'


def _outcomes(episodes) -> list[tuple]:
    return [(e['task_name'], e['seed'], e['is_success'], e['num_steps']) for e in episodes]


def same_as_ar(row: dict, rows: list[dict]) -> str:
    """For a strict row (r = 0): 'yes' when every episode has AR's outcome and length (the same
    trajectory in lock-step), else how many differ; '-' for AR, relaxed rows or without AR."""
    ar = next((r for r in rows if r['mode'] == 'ar'), None)
    if ar is None or row['mode'] == 'ar' or row['relax_threshold'] != 0:
        return '-'
    mine, ref = _outcomes(row['episodes']), _outcomes(ar['episodes'])
    if len(mine) != len(ref):
        return 'n/a'
    differ = sum(a != b for a, b in zip(mine, ref))
    return 'yes' if differ == 0 else f'no ({differ} differ)'


def _bench_by_mode(record) -> dict:
    return {r['mode']: r for r in (record.get('speed') or {}).get('bench_rows', [])}


def stream_rows(record: dict) -> tuple[dict | None, list]:
    stream = record.get('stream') or {}
    rows = stream.get('rows', [])
    ar = next((r for r in rows if r['mode'] == 'ar' and r['where'] != WHERE_MODEL), None)
    return ar, rows


def format_stream_table(record: dict) -> str:
    """mode | where | frames answered | p50 | p99 | ×AR p50 | actions/s (+ forwards/action)."""
    ar, rows = stream_rows(record)
    head = ['mode', 'where', 'frames answered', 'p50 ms', 'p99 ms', '×AR p50', 'actions/s',
            'forwards/action']
    out = []
    for r in rows:
        ratio = (measured(r['latency_p50_ms']) / measured(ar['latency_p50_ms'])
                 if ar is not None else math.nan)
        out.append([mode_label(r), r['where'],
                    f"{r['num_answered']}/{r['num_frames']} "
                    f"({100 * measured(r['answered_fraction']):.0f}%)",
                    fmt(r['latency_p50_ms'], 1), fmt(r['latency_p99_ms'], 1),
                    fmt(ratio), fmt(r['actions_per_s'], 1),
                    fmt(r.get('forwards_per_action'))])
    return markdown_table(head, out)


def format_lockstep_table(record: dict) -> str:
    lock = record['lockstep']
    bench = _bench_by_mode(record)
    head = ['mode', 'r', 'success', 'same episodes as AR', 'lock-step steps/s (simulator-bound)',
            'node latency p50 / p99 ms', 'node actions/s', 'model-only actions/s',
            'acceptance length', 'forwards/action', 'episodes']
    rows = []
    if lock.get('expert') is not None:
        expert = lock['expert']
        rows.append(['expert', '-', fmt(expert['success_rate'])] + ['-'] * 7
                    + [expert['num_episodes']])
    for r in lock['rows']:
        model = bench.get(r['mode'], {}).get('actions_per_s') if r['relax_threshold'] == 0 \
            else None
        rows.append([r['mode'], r['relax_threshold'], fmt(r['success_rate']),
                     same_as_ar(r, lock['rows']), fmt(r['actions_per_s'], 1),
                     f"{fmt(r['latency_p50_ms'], 1)} / {fmt(r['latency_p99_ms'], 1)}",
                     fmt(r.get('node_actions_per_s'), 1), fmt(model, 1),
                     fmt(r['acceptance_length']), fmt(r['forwards_per_action']),
                     len(r['episodes'])])
    return markdown_table(head, rows)


def format_realtime_table(record: dict) -> str:
    """The lock-step part run with --sim-mode realtime: one row per (model, mode, r, camera
    delay d) with success per task, the node's latency, the bridge's stale commands and late
    ticks, and a chunked model's steps on the node."""
    lock, tasks = record['lockstep'], record['tasks']
    models = lock.get('models') or [record['model']]
    head = (['model'] if len(models) > 1 else []) + [
        'mode', 'r', 'camera delay d', 'success'] + list(tasks) + [
        'latency p50 / p99 ms', 'applied answers: mean lag (periods), on time',
        'stale / hold commands / steps', 'late ticks',
        'chunk steps published / skipped', 'chunk run-outs / refused', 'episodes']
    rows = []
    for r in lock['rows']:
        chunk = r.get('action_chunk', 1)
        chunk_cells = (['-', '-'] if chunk <= 1 else [
            f"{r['num_chunk_steps_published']} / {r['num_chunk_steps_skipped']}",
            f"{r['num_chunk_run_outs']} / {r.get('num_chunks_refused', '-')}"])
        model = f"{r.get('model', record['model'])} (" + (
            'single-step)' if chunk <= 1 else f'chunks of {chunk})')
        rows.append(([model] if len(models) > 1 else []) + [
            r['mode'] + ('' if r.get('chunk_blend', 'latest') == 'latest'
                         else f" ({r['chunk_blend']})"),
            r['relax_threshold'], r.get('camera_delay', 0), fmt(r['success_rate'])]
            + [fmt(r['success_rate_per_task'].get(t)) for t in tasks]
            + [f"{fmt(r['latency_p50_ms'], 1)} / {fmt(r['latency_p99_ms'], 1)}",
               _lag_cell(r),
               f"{r['num_stale_commands']} / {r.get('num_hold_commands', 0)} / {r['num_steps']}",
               r.get('num_late_ticks', 0)]
            + chunk_cells + [len(r['episodes'])])
    return markdown_table(head, rows)


def _lag_cell(row: dict) -> str:
    """'1.02, 3%': the mean lag of the applied answers and the share applied on time."""
    num = row.get('num_answer_steps') or 0
    if not num:
        return '-'
    return (f"{row['answer_lag_sum'] / num:.2f}, "
            f"{100 * row['num_answer_steps_on_time'] / num:.0f}%")


def format_task_table(rows: list[dict], tasks, label) -> str:
    """Success per task, one row per configuration."""
    head = ['configuration'] + list(tasks)
    return markdown_table(head, [[label(r)] + [fmt(r['success_rate_per_task'].get(t))
                                               for t in tasks] for r in rows])


def format_speed_table(record: dict) -> str:
    speed = record['speed']
    rates = [str(r) for r in speed.get('paced', {})]
    head = ['mode', 'actions/s', '× HF', 'latency p50 ms (saturated)', 'forwards/action',
            'tokens/action', 'acceptance length'] + [
                f'@ {float(r):g} Hz: latency p50 ms, frames answered' for r in rates]
    rows = []
    drafter = speed.get('drafter', {})
    for b in speed['bench_rows']:
        label = b['mode']
        if drafter.get(b['mode'], '-') != '-':
            label = mode_label({'mode': b['mode'], 'drafter': drafter[b['mode']]})
        cells = [label, fmt(b['actions_per_s'], 1), fmt(b['ratio_vs_hf']),
                 fmt(b['latency_p50_ms'], 1), fmt(b['forwards_per_action']),
                 fmt(b.get('tokens_per_action'), 1), fmt(b['acceptance_length'])]
        for rate in rates:
            paced = speed['paced'][rate].get(b['mode'])
            cells.append('-' if paced is None else
                         f"{fmt(paced['latency_p50_ms'], 1)}, "
                         f"{100 * paced['answered_fraction']:.0f}%")
        rows.append(cells)
    return markdown_table(head, rows)


def format_delay_models_table(record: dict) -> str:
    """Success per delay of each model side by side ('' with one model)."""
    curves = model_curves(record)
    if len(curves) < 2:
        return ''
    head = ['delay d (periods)']
    for label, _ in curves:
        head += [f'{label}: every frame', f'{label}: one in flight']
    delays = sorted({d for _, c in curves for frames in c.values() for d in frames})
    rows = [[d] + [fmt(c[frames].get(d)) for _, c in curves
                   for frames in ('every', 'one_in_flight')] for d in delays]
    return markdown_table(head, rows)


def format_delay_table(record: dict) -> str:
    delay = record['delay']
    curve = delay_curve(record)
    rates = list(record.get('speed', {}).get('paced', {})) or []
    head = ['delay d (periods)', 'success, every frame answered', 'success, one frame in flight']
    head += [f'= ms at {float(r):g} Hz' for r in rates]
    rows = []
    for d in sorted(set(curve['every']) | set(curve['one_in_flight'])):
        rows.append([d, fmt(curve['every'].get(d)), fmt(curve['one_in_flight'].get(d))]
                    + [f'{1e3 * d / float(r):.0f}' for r in rates])
    text = markdown_table(head, rows)
    text += (f"\n{episodes(delay['episodes'])} per task and point, hold "
             f"{delay['hold']}, {delay['path']}\n")
    if delay.get('model'):
        text = f"{model_curves(record)[0][0]}:\n\n" + text
    compared = format_delay_models_table(record)
    if compared:
        text += ('\nEvery model of the delay part (`--delay-models`), same episodes and '
                 'schedule. A chunked model executes its chunks on the control clock: the chunk '
                 'decided from period t\'s frame lands at t + d and starts at its step d (steps '
                 '0 .. d-1 are past), the newest chunk wins, and when the newest chunk has no '
                 'step left the arm holds (hold ' + delay['hold'] + '). With one frame in '
                 'flight a single-step model acts on d-period-old information every step, a '
                 'chunk executes its planned steps d .. 2d-1 on time (those beyond its last '
                 'step are holds). Latencies are placed on the first model\'s curve.\n\n'
                 + compared)
    rule = ('d = ceil(latency × rate); one frame in flight when the mode answered fewer than '
            f'{100 * KEEPS_UP_FRACTION:.0f}% of the camera frames (~ interpolated, > beyond the '
            'largest delay measured)')
    streamed = stream_placements(record)
    if streamed:
        head = ['mode', 'where', 'frames answered', 'latency p50 ms', 'd', 'success at d']
        rows = [[p['label'], p['where'], f"{100 * measured(p['answered_fraction']):.0f}% "
                 f"({p['frames'].replace('_', ' ')})", fmt(p['latency_p50_ms'], 1),
                 p['delay'], p['mark'] + fmt(p['success'])] for p in streamed]
        text += (f"\nEach mode on the curve by its streaming latency at "
                 f"{streamed[0]['rate_hz']:g} Hz (the streaming table): {rule}:\n\n"
                 + markdown_table(head, rows))
    reference = reference_placements(record)
    if reference:
        source = record['reference_7b']
        head = ['configuration', 'latency ms', 'which latency', 'actions/s', 'd',
                'success at d']
        rows = [[p['label'], fmt(p['latency_p50_ms'], 1), p['latency_kind'],
                 fmt(p['actions_per_s'], 1), p['delay'], p['mark'] + fmt(p['success'])]
                for p in reference]
        text += (f"\nOpenVLA-7B, {REFERENCE_7B_TITLE}: the latencies of `{source['file']}` "
                 f"({source['device']}, {source['dtype']}, {source['weights']}) placed on this "
                 f"run's curve at {reference[0]['rate_hz']:g} Hz (every frame answered when "
                 f"the recorded actions/s reach the camera rate, else one in flight). "
                 f"{source['note']}\n\n" + markdown_table(head, rows))
    places = placements(record)
    if places:
        head = ['mode', 'rate Hz', 'frames answered', 'model-only latency p50 ms', 'd',
                'success at d', 'node latency p50 ms (lock-step)', 'd', 'success at d']
        rows = []
        for p in places:
            cells = [p['mode'], f"{p['rate_hz']:g}",
                     f"{100 * p['answered_fraction']:.0f}% ({p['frames'].replace('_', ' ')})"]
            for source in ('model', 'node'):
                s = p.get(source)
                cells += (['-'] * 3 if s is None else
                          [fmt(s['latency_p50_ms'], 1), s['delay'],
                           s['mark'] + fmt(s['success'])])
            rows.append(cells)
        text += (f'\nEach mode by its model-only latency at each rate (and its lock-step '
                 f'latency on the node, one frame in flight by construction): {rule}:\n\n'
                 + markdown_table(head, rows))
    return text


def format_relax_table(record: dict) -> str:
    relax = record['relax']
    head = ['r', 'success', 'acceptance length', 'forwards/action', 'tokens ≠ AR',
            'largest bin distance to AR', 'episodes']
    rows = []
    for p in relax['points']:
        counts = p['bin_distance_counts']
        total = sum(sum(c) for c in counts) or 1
        largest = max((k for c in counts for k, n in enumerate(c) if n), default=0)
        rows.append([p['point']['relax_threshold'], fmt(p['success_rate']),
                     fmt(p['acceptance_length']), fmt(p['forwards_per_action']),
                     f"{100 * p['num_token_mismatches'] / total:.1f}%", largest,
                     len(p['episodes'])])
    tree = relax['tree']
    return (markdown_table(head, rows) + f"\nmode {relax['mode']}, draft tree depth "
            f"{tree[0]}, top-k {tree[1]}, {tree[2]} nodes; {episodes(relax['episodes'])} per "
            f"task and r; {relax['path']}\n")


__all__ = ['WHERE_MODEL', 'REFERENCE_7B_TITLE', 'fmt', 'episodes', 'markdown_table', 'stream_rows',
           'same_as_ar',
           'format_stream_table', 'format_lockstep_table', 'format_realtime_table',
           'format_task_table', 'format_speed_table', 'format_delay_models_table',
           'format_delay_table', 'format_relax_table']
