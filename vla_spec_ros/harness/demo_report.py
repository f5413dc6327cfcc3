"""The demo's tables, from its record (the JSON `vla-spec demo` writes): pure functions of
that record, used for the printed report, the Markdown file and `--report` re-rendering.
Where the delay part's curve and each mode's latency meet (`placements`) is computed here too,
so a recorded run can be placed again with another run's latencies."""
from __future__ import annotations

import math

# A mode "keeps up" with a camera when it answers at least this share of its frames.
KEEPS_UP_FRACTION = 0.95


def measured(value) -> float:
    """A recorded value as a float: NaN where nothing was measured (JSON null)."""
    return math.nan if value is None else float(value)


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    return f'{value:.{digits}f}'


def _episodes(count: int) -> str:
    return f'{count} episode' + ('' if count == 1 else 's')


def _table(head, rows) -> str:
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


def format_lockstep_table(record: dict) -> str:
    lock = record['lockstep']
    bench = _bench_by_mode(record)
    head = ['mode', 'r', 'success', 'same episodes as AR', 'lock-step steps/s (simulator-bound)',
            'node latency p50 / p99 ms', 'node actions/s', 'model-only actions/s',
            'acceptance length', 'forwards/action', 'episodes']
    rows = []
    if lock.get('expert') is not None:
        expert = lock['expert']
        rows.append(['expert', '-', _fmt(expert['success_rate'])] + ['-'] * 7
                    + [expert['num_episodes']])
    for r in lock['rows']:
        model = bench.get(r['mode'], {}).get('actions_per_s') if r['relax_threshold'] == 0 \
            else None
        rows.append([r['mode'], r['relax_threshold'], _fmt(r['success_rate']),
                     same_as_ar(r, lock['rows']), _fmt(r['actions_per_s'], 1),
                     f"{_fmt(r['latency_p50_ms'], 1)} / {_fmt(r['latency_p99_ms'], 1)}",
                     _fmt(r.get('node_actions_per_s'), 1), _fmt(model, 1),
                     _fmt(r['acceptance_length']), _fmt(r['forwards_per_action']),
                     len(r['episodes'])])
    return _table(head, rows)


def format_task_table(rows: list[dict], tasks, label) -> str:
    """Success per task, one row per configuration."""
    head = ['configuration'] + list(tasks)
    return _table(head, [[label(r)] + [_fmt(r['success_rate_per_task'].get(t)) for t in tasks]
                         for r in rows])


def format_speed_table(record: dict) -> str:
    speed = record['speed']
    rates = [str(r) for r in speed.get('paced', {})]
    head = ['mode', 'actions/s', '× HF', 'latency p50 ms (saturated)', 'forwards/action',
            'acceptance length'] + [f'@ {float(r):g} Hz: latency p50 ms, frames answered'
                                    for r in rates]
    rows = []
    for b in speed['bench_rows']:
        cells = [b['mode'], _fmt(b['actions_per_s'], 1), _fmt(b['ratio_vs_hf']),
                 _fmt(b['latency_p50_ms'], 1), _fmt(b['forwards_per_action']),
                 _fmt(b['acceptance_length'])]
        for rate in rates:
            paced = speed['paced'][rate].get(b['mode'])
            cells.append('-' if paced is None else
                         f"{_fmt(paced['latency_p50_ms'], 1)}, "
                         f"{100 * paced['answered_fraction']:.0f}%")
        rows.append(cells)
    return _table(head, rows)


def delay_curve(record: dict) -> dict:
    """{'every': {d: success}, 'one_in_flight': {d: success}} (d = 0, 1 in both: identical)."""
    curve = {'every': {}, 'one_in_flight': {}}
    for p in record['delay']['points']:
        curve[p['point']['delay_frames']][p['point']['action_delay']] = p['success_rate']
    for d, rate in curve['every'].items():
        if d <= 1:
            curve['one_in_flight'].setdefault(d, rate)
    return curve


def success_at(curve: dict, frames: str, delay: int) -> tuple[float, str]:
    """Success on the curve at `delay` periods: measured, linearly interpolated between the
    nearest measured delays ('~'), or beyond the largest ('>')."""
    points = curve.get(frames) or {}
    if delay in points:
        return points[delay], ''
    below = [d for d in points if d < delay]
    above = [d for d in points if d > delay]
    if not points or not below:
        return math.nan, '?'
    if not above:
        d = max(below)
        return points[d], '>'
    lo, hi = max(below), min(above)
    w = (delay - lo) / (hi - lo)
    return (1 - w) * points[lo] + w * points[hi], '~'


def placements(record: dict) -> list[dict]:
    """Each mode's latency placed on the delay curve at each rate: model only (paced camera)
    and, where the lock-step part ran, on the node."""
    if 'delay' not in record or 'speed' not in record:
        return []
    curve = delay_curve(record)
    node = {r['mode']: r for r in (record.get('lockstep') or {}).get('rows', [])
            if r['relax_threshold'] == 0}
    out = []
    for rate_key, per_mode in record['speed'].get('paced', {}).items():
        rate = float(rate_key)
        for mode, paced in per_mode.items():
            keeps_up = paced['answered_fraction'] >= KEEPS_UP_FRACTION
            frames = 'every' if keeps_up else 'one_in_flight'
            entry = {'mode': mode, 'rate_hz': rate, 'frames': frames,
                     'answered_fraction': paced['answered_fraction']}
            for source, latency in (('model', paced['latency_p50_ms']),
                                    ('node', node.get(mode, {}).get('latency_p50_ms'))):
                latency = measured(latency)
                if math.isnan(latency):
                    continue
                delay = max(1, math.ceil(latency * 1e-3 * rate - 1e-9))
                success, mark = success_at(curve, frames, delay)
                entry[source] = {'latency_p50_ms': latency, 'delay': delay,
                                 'success': success, 'mark': mark}
            out.append(entry)
    return out


def format_delay_table(record: dict) -> str:
    delay = record['delay']
    curve = delay_curve(record)
    rates = list(record.get('speed', {}).get('paced', {})) or []
    head = ['delay d (periods)', 'success, every frame answered', 'success, one frame in flight']
    head += [f'= ms at {float(r):g} Hz' for r in rates]
    rows = []
    for d in sorted(set(curve['every']) | set(curve['one_in_flight'])):
        rows.append([d, _fmt(curve['every'].get(d)), _fmt(curve['one_in_flight'].get(d))]
                    + [f'{1e3 * d / float(r):.0f}' for r in rates])
    text = _table(head, rows)
    text += (f"\n{_episodes(delay['episodes'])} per task and point, hold "
             f"{delay['hold']}, {delay['path']}\n")
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
                          [_fmt(s['latency_p50_ms'], 1), s['delay'],
                           s['mark'] + _fmt(s['success'])])
            rows.append(cells)
        text += ('\nEach mode on the curve: d = ceil(latency × rate); one frame in flight '
                 'when the mode answered fewer than '
                 f'{100 * KEEPS_UP_FRACTION:.0f}% of the camera frames (~ interpolated, '
                 '> beyond the largest delay measured):\n\n' + _table(head, rows))
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
        rows.append([p['point']['relax_threshold'], _fmt(p['success_rate']),
                     _fmt(p['acceptance_length']), _fmt(p['forwards_per_action']),
                     f"{100 * p['num_token_mismatches'] / total:.1f}%", largest,
                     len(p['episodes'])])
    tree = relax['tree']
    return (_table(head, rows) + f"\nmode {relax['mode']}, draft tree depth {tree[0]}, top-k "
            f"{tree[1]}, {tree[2]} nodes; {_episodes(relax['episodes'])} per task and r; "
            f"{relax['path']}\n")


def format_report(record: dict) -> str:
    """Every table of a run, in the order a reader wants them."""
    tasks = record['tasks']
    out = []
    if 'lockstep' in record:
        lock = record['lockstep']
        out += [f"## Lock-step through the ROS 2 node and the simulator bridge "
                f"({_episodes(lock['episodes'])} per task and mode)\n",
                format_lockstep_table(record),
                'steps/s: the whole loop, rendering and DDS included (simulator-bound); node '
                'actions/s: 1 / mean frame -> command latency (one frame in flight); '
                'model-only actions/s: the speed table below.\n',
                format_task_table(lock['rows'], tasks,
                                  lambda r: f"{r['mode']} r={r['relax_threshold']}")]
    if 'speed' in record:
        out += ['## Model only (no ROS, no simulator)\n', format_speed_table(record),
                f"`vla-spec bench` workload ({record['speed']['bench_frames']} frames, a camera "
                'faster than inference) for actions/s and × HF (the Hugging Face AR baseline, '
                'same run); the @ Hz columns feed Meta-World frames at that camera rate the way '
                'the node does (the newest frame replaces a waiting one).\n']
    if 'delay' in record:
        out += ['## Success against action delay (delayed lock-step, AR actions)\n',
                format_delay_table(record)]
    if 'relax' in record:
        out += ['## Relaxed acceptance: the trade-off\n', format_relax_table(record)]
    return '\n'.join(out)


__all__ = ['KEEPS_UP_FRACTION', 'measured', 'format_report', 'format_lockstep_table',
           'format_speed_table', 'format_delay_table', 'format_relax_table', 'format_task_table',
           'placements', 'delay_curve', 'success_at', 'same_as_ar']
