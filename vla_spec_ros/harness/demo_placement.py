"""Where the demo's delay curve and each mode's latency meet, from its record (the JSON
`vla-spec demo` writes): the delay part's curve (`delay_curve`; one per checkpoint of
`--delay-models`, `model_curves`), one latency placed on it at a rate (`place`: d = ceil(latency
× rate) periods, on the every-frame curve when the mode keeps up with the camera, else one frame
in flight; `success_at` reads or interpolates the curve there), and every part's latencies so
placed (`stream_placements`, `placements`, `reference_placements`).

Contracts: pure functions of the record, importing nothing of the harness that needs ROS or
torch, so a recorded run can be placed again with another run's latencies (`--report
--latencies-from`); a latency that was not measured (JSON null) is not placed. The labels the
placements carry (`mode_label`, `model_label`) and `measured` are shared with the tables
(demo_tables.py).
"""
from __future__ import annotations

import math

# A mode "keeps up" with a camera when it answers at least this share of its frames.
KEEPS_UP_FRACTION = 0.95


def measured(value) -> float:
    """A recorded value as a float: NaN where nothing was measured (JSON null)."""
    return math.nan if value is None else float(value)


def mode_label(row: dict) -> str:
    """'pipeline_spec (default: previous-action draft)', 'spec (previous-action draft)', 'ar'."""
    drafter = row.get('drafter') or '-'
    draft = '' if drafter == '-' else (
        'previous-action draft' if drafter == 'previous action' else f'draft {drafter}')
    if row.get('is_default'):
        return f"{row['mode']} (default{': ' + draft if draft else ''})"
    return f"{row['mode']} ({draft})" if draft else row['mode']


def lockstep_rows_placed(record: dict) -> list[dict]:
    """The lock-step part's rows whose latency is placed on the delay curve: the first model's,
    r = 0, without a camera delay."""
    lock = record.get('lockstep') or {}
    first = (lock.get('models') or [record.get('model')])[0]
    return [r for r in lock.get('rows', []) if r['relax_threshold'] == 0
            and r.get('camera_delay', 0) == 0 and r.get('model', first) == first]


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


__all__ = ['KEEPS_UP_FRACTION', 'measured', 'mode_label', 'lockstep_rows_placed', 'delay_curve',
           'model_label', 'model_curves', 'success_at', 'place', 'placements',
           'stream_placements', 'curve_rate', 'reference_placements']
