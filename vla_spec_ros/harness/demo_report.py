"""The demo's tables, from its record (the JSON `vla-spec demo` writes): pure functions of
that record, used for the printed report, the Markdown file and `--report` re-rendering.
Where the delay part's curve and each mode's latency meet (`placements`, `stream_placements`,
`reference_placements`) is computed here too, so a recorded run can be placed again with
another run's latencies."""
from __future__ import annotations

import math

# A mode "keeps up" with a camera when it answers at least this share of its frames.
KEEPS_UP_FRACTION = 0.95
# streaming.WHERE_MODEL (this module imports nothing of the harness that needs ROS or torch).
WHERE_MODEL = 'model only (not on the node)'
REFERENCE_7B_TITLE = 'recorded on an H100, OpenVLA-7B shape, not measured by this demo'


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


def mode_label(row: dict) -> str:
    """'pipeline_spec (default: previous-action draft)', 'spec (previous-action draft)', 'ar'."""
    drafter = row.get('drafter') or '-'
    draft = '' if drafter == '-' else (
        'previous-action draft' if drafter == 'previous action' else f'draft {drafter}')
    if row.get('is_default'):
        return f"{row['mode']} (default{': ' + draft if draft else ''})"
    return f"{row['mode']} ({draft})" if draft else row['mode']


def _stream_rows(record: dict) -> tuple[dict | None, list]:
    stream = record.get('stream') or {}
    rows = stream.get('rows', [])
    ar = next((r for r in rows if r['mode'] == 'ar' and r['where'] != WHERE_MODEL), None)
    return ar, rows


def format_stream_table(record: dict) -> str:
    """mode | where | frames answered | p50 | p99 | ×AR p50 | actions/s (+ forwards/action)."""
    ar, rows = _stream_rows(record)
    head = ['mode', 'where', 'frames answered', 'p50 ms', 'p99 ms', '×AR p50', 'actions/s',
            'forwards/action']
    out = []
    for r in rows:
        ratio = (measured(r['latency_p50_ms']) / measured(ar['latency_p50_ms'])
                 if ar is not None else math.nan)
        out.append([mode_label(r), r['where'],
                    f"{r['num_answered']}/{r['num_frames']} "
                    f"({100 * measured(r['answered_fraction']):.0f}%)",
                    _fmt(r['latency_p50_ms'], 1), _fmt(r['latency_p99_ms'], 1),
                    _fmt(ratio), _fmt(r['actions_per_s'], 1),
                    _fmt(r.get('forwards_per_action'))])
    return _table(head, out)


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
    return text + '\n'


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
        'chunk steps published / skipped', 'chunk run-outs', 'episodes']
    rows = []
    for r in lock['rows']:
        chunk = r.get('action_chunk', 1)
        chunk_cells = (['-', '-'] if chunk <= 1 else [
            f"{r['num_chunk_steps_published']} / {r['num_chunk_steps_skipped']}",
            r['num_chunk_run_outs']])
        model = f"{r.get('model', record['model'])} (" + (
            'single-step)' if chunk <= 1 else f'chunks of {chunk})')
        rows.append(([model] if len(models) > 1 else []) + [
            r['mode'], r['relax_threshold'], r.get('camera_delay', 0), _fmt(r['success_rate'])]
            + [_fmt(r['success_rate_per_task'].get(t)) for t in tasks]
            + [f"{_fmt(r['latency_p50_ms'], 1)} / {_fmt(r['latency_p99_ms'], 1)}",
               _lag_cell(r),
               f"{r['num_stale_commands']} / {r.get('num_hold_commands', 0)} / {r['num_steps']}",
               r.get('num_late_ticks', 0)]
            + chunk_cells + [len(r['episodes'])])
    return _table(head, rows)


def _lag_cell(row: dict) -> str:
    """'1.02, 3%': the mean lag of the applied answers and the share applied on time."""
    num = row.get('num_answer_steps') or 0
    if not num:
        return '-'
    return (f"{row['answer_lag_sum'] / num:.2f}, "
            f"{100 * row['num_answer_steps_on_time'] / num:.0f}%")


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
            'steps and run-outs are the node\'s counters while episodes ran.\n')


def lockstep_rows_placed(record: dict) -> list[dict]:
    """The lock-step part's rows whose latency is placed on the delay curve: the first model's,
    r = 0, without a camera delay."""
    lock = record.get('lockstep') or {}
    first = (lock.get('models') or [record.get('model')])[0]
    return [r for r in lock.get('rows', []) if r['relax_threshold'] == 0
            and r.get('camera_delay', 0) == 0 and r.get('model', first) == first]


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
    drafter = speed.get('drafter', {})
    for b in speed['bench_rows']:
        label = b['mode']
        if drafter.get(b['mode'], '-') != '-':
            label = mode_label({'mode': b['mode'], 'drafter': drafter[b['mode']]})
        cells = [label, _fmt(b['actions_per_s'], 1), _fmt(b['ratio_vs_hf']),
                 _fmt(b['latency_p50_ms'], 1), _fmt(b['forwards_per_action']),
                 _fmt(b['acceptance_length'])]
        for rate in rates:
            paced = speed['paced'][rate].get(b['mode'])
            cells.append('-' if paced is None else
                         f"{_fmt(paced['latency_p50_ms'], 1)}, "
                         f"{100 * paced['answered_fraction']:.0f}%")
        rows.append(cells)
    return _table(head, rows)


def delay_curve(record: dict, points: list | None = None) -> dict:
    """{'every': {d: success}, 'one_in_flight': {d: success}} (d = 0, 1 in both: identical),
    of the record's delay part (the first model's curve) or of `points`."""
    curve = {'every': {}, 'one_in_flight': {}}
    for p in record['delay']['points'] if points is None else points:
        curve[p['point']['delay_frames']][p['point']['action_delay']] = p['success_rate']
    for d, rate in curve['every'].items():
        if d <= 1:
            curve['one_in_flight'].setdefault(d, rate)
    return curve


def model_label(entry: dict) -> str:
    """'metaworld-demo-chunk4 (chunks of 4)' or 'metaworld-demo (single-step)'."""
    chunk = int(entry.get('action_chunk') or 1)
    return f"{entry['model']} ({'single-step' if chunk == 1 else f'chunks of {chunk}'})"


def model_curves(record: dict) -> list[tuple[str, dict]]:
    """(label, delay curve) of every model of the delay part (`--delay-models`); one entry
    for a record of a single model or from before the option."""
    delay = record['delay']
    entries = delay.get('models') or [{'model': delay.get('model', record.get('model', '?')),
                                       'action_chunk': delay.get('action_chunk', 1),
                                       'points': delay['points']}]
    return [(model_label(e), delay_curve(record, e['points'])) for e in entries]


def format_delay_models_table(record: dict) -> str:
    """Success per delay of each model side by side ('' with one model)."""
    curves = model_curves(record)
    if len(curves) < 2:
        return ''
    head = ['delay d (periods)']
    for label, _ in curves:
        head += [f'{label}: every frame', f'{label}: one in flight']
    delays = sorted({d for _, c in curves for frames in c.values() for d in frames})
    rows = [[d] + [_fmt(c[frames].get(d)) for _, c in curves
                   for frames in ('every', 'one_in_flight')] for d in delays]
    return _table(head, rows)


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


def place(curve: dict, latency_ms, rate_hz: float, keeps_up: bool) -> dict | None:
    """A latency on the delay curve at `rate_hz`: d = ceil(latency × rate) (at least 1), on
    the every-frame curve when the mode keeps up with the camera, else one frame in flight;
    None where no latency was measured."""
    latency = measured(latency_ms)
    if math.isnan(latency):
        return None
    delay = max(1, math.ceil(latency * 1e-3 * rate_hz - 1e-9))
    frames = 'every' if keeps_up else 'one_in_flight'
    success, mark = success_at(curve, frames, delay)
    return {'latency_p50_ms': latency, 'delay': delay, 'success': success, 'mark': mark,
            'frames': frames}


def placements(record: dict) -> list[dict]:
    """Each mode's latency placed on the delay curve at each rate: model only (paced camera)
    and, where the lock-step part ran, on the node in lock-step."""
    if 'delay' not in record or 'speed' not in record:
        return []
    curve = delay_curve(record)
    node = {r['mode']: r for r in lockstep_rows_placed(record)}
    out = []
    for rate_key, per_mode in record['speed'].get('paced', {}).items():
        rate = float(rate_key)
        for mode, paced in per_mode.items():
            keeps_up = paced['answered_fraction'] >= KEEPS_UP_FRACTION
            entry = {'mode': mode, 'rate_hz': rate,
                     'frames': 'every' if keeps_up else 'one_in_flight',
                     'answered_fraction': paced['answered_fraction']}
            for source, latency in (('model', paced['latency_p50_ms']),
                                    ('node', node.get(mode, {}).get('latency_p50_ms'))):
                spot = place(curve, latency, rate, keeps_up)
                if spot is not None:
                    entry[source] = {k: v for k, v in spot.items() if k != 'frames'}
            out.append(entry)
    return out


def stream_placements(record: dict) -> list[dict]:
    """Each streaming row placed on the delay curve at the camera rate, by its latency p50 on
    the node (the Hugging Face row by its model-only latency, labelled so)."""
    if 'delay' not in record or not (record.get('stream') or {}).get('rows'):
        return []
    curve, rate = delay_curve(record), float(record['stream']['rate_hz'])
    out = []
    for row in record['stream']['rows']:
        spot = place(curve, row['latency_p50_ms'], rate,
                     measured(row['answered_fraction']) >= KEEPS_UP_FRACTION)
        if spot is not None:
            out.append(dict(spot, mode=row['mode'], label=mode_label(row), where=row['where'],
                            rate_hz=rate, answered_fraction=row['answered_fraction'],
                            is_default=bool(row.get('is_default'))))
    return out


def curve_rate(record: dict) -> float | None:
    """The rate at which modes are drawn on the curve: the streaming part's camera rate, else
    the middle of the speed part's rates."""
    if (record.get('stream') or {}).get('rate_hz'):
        return float(record['stream']['rate_hz'])
    rates = sorted(float(r) for r in (record.get('speed') or {}).get('paced', {}))
    return rates[len(rates) // 2] if rates else None


def reference_placements(record: dict) -> list[dict]:
    """The recorded OpenVLA-7B latencies (record['reference_7b'], not measured by this run) on
    this run's curve at `curve_rate`: every frame answered when the recorded throughput is at
    least the camera rate, else one frame in flight."""
    reference, rate = record.get('reference_7b') or {}, curve_rate(record)
    if 'delay' not in record or not reference.get('rows') or rate is None:
        return []
    curve = delay_curve(record)
    out = []
    for row in reference['rows']:
        spot = place(curve, row['latency_ms'], rate, row['actions_per_s'] >= rate)
        if spot is not None:
            out.append(dict(spot, mode=row['mode'], label=row['label'], rate_hz=rate,
                            latency_kind=row['latency_kind'],
                            actions_per_s=row['actions_per_s']))
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
                 f"({p['frames'].replace('_', ' ')})", _fmt(p['latency_p50_ms'], 1),
                 p['delay'], p['mark'] + _fmt(p['success'])] for p in streamed]
        text += (f"\nEach mode on the curve by its streaming latency at "
                 f"{streamed[0]['rate_hz']:g} Hz (the streaming table): {rule}:\n\n"
                 + _table(head, rows))
    reference = reference_placements(record)
    if reference:
        source = record['reference_7b']
        head = ['configuration', 'latency ms', 'which latency', 'actions/s', 'd',
                'success at d']
        rows = [[p['label'], _fmt(p['latency_p50_ms'], 1), p['latency_kind'],
                 _fmt(p['actions_per_s'], 1), p['delay'], p['mark'] + _fmt(p['success'])]
                for p in reference]
        text += (f"\nOpenVLA-7B, {REFERENCE_7B_TITLE}: the latencies of `{source['file']}` "
                 f"({source['device']}, {source['dtype']}, {source['weights']}) placed on this "
                 f"run's curve at {reference[0]['rate_hz']:g} Hz (every frame answered when "
                 f"the recorded actions/s reach the camera rate, else one in flight). "
                 f"{source['note']}\n\n" + _table(head, rows))
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
        text += (f'\nEach mode by its model-only latency at each rate (and its lock-step '
                 f'latency on the node, one frame in flight by construction): {rule}:\n\n'
                 + _table(head, rows))
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


def _stream_cell(row: dict, ar: dict | None) -> str:
    text = (f"p50 {_fmt(row['latency_p50_ms'], 1)} ms, p99 {_fmt(row['latency_p99_ms'], 1)} ms, "
            f"{_fmt(row['actions_per_s'], 1)} actions/s, "
            f"{100 * measured(row['answered_fraction']):.0f}% of frames answered")
    if ar is not None and row is not ar:
        ratio = measured(row['latency_p50_ms']) / measured(ar['latency_p50_ms'])
        text += f' (p50 ×{_fmt(ratio)} AR\'s)'
    return text


def format_summary(record: dict) -> str:
    """The closing lines: the default configuration against AR and the Hugging Face baseline
    at the camera rate, and where each lands on the delay curve ('' without a stream part)."""
    ar, rows = _stream_rows(record)
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
            f"({p['mark']}{_fmt(p['success'])})" for p in spots))
    reference = reference_placements(record)
    if reference:
        lines.append(f'- OpenVLA-7B ({REFERENCE_7B_TITLE}): ' + ', '.join(
            f"{p['label']} {_fmt(p['latency_p50_ms'], 0)} ms, d = {p['delay']} "
            f"({p['mark']}{_fmt(p['success'])})" for p in reference))
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
                f"({_episodes(lock['episodes'])} per task and row): success\n",
                format_realtime_table(record), realtime_caption(record)]
    elif 'lockstep' in record:
        lock = record['lockstep']
        out += [f"## Lock-step through the ROS 2 node and the simulator bridge "
                f"({_episodes(lock['episodes'])} per task and mode): success\n",
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
                'AR baseline, same run), the saturated latency and verifier forwards per '
                'action; the @ Hz columns feed '
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


__all__ = ['KEEPS_UP_FRACTION', 'WHERE_MODEL', 'REFERENCE_7B_TITLE', 'measured',
           'format_report', 'format_summary', 'format_stream_table', 'format_lockstep_table',
           'format_realtime_table', 'realtime_caption', 'lockstep_rows_placed',
           'format_speed_table', 'format_delay_table', 'format_relax_table', 'format_task_table',
           'mode_label', 'place', 'placements', 'stream_placements', 'reference_placements',
           'curve_rate', 'delay_curve', 'success_at', 'same_as_ar', 'model_label',
           'model_curves', 'format_delay_models_table']
