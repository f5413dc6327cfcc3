"""The main job's closing table: one row per model of a `vla-spec demo` chain (the default
model, then `--second-model auto`'s), so that a user reads the three models side by side
instead of scrolling back through three reports.

Contract: a pure function of the chain's records (the JSON each pass writes); per model it
takes the streaming part's AR row and default row (the node at the camera rate) and the
lock-step part's AR row and default-mode row at r = 0 without a camera delay. A part a pass
did not run shows as '-'.
"""
from __future__ import annotations

from vla_spec_ros.harness.demo_placement import measured
from vla_spec_ros.harness.demo_tables import fmt, markdown_table, stream_rows

ROLLUP_TITLE = 'All models of this run (the node at the camera rate; success through the node)'


def _lockstep_pair(record: dict, default_mode: str | None) -> tuple[dict | None, dict | None]:
    """The lock-step part's AR row and the default mode's row, r = 0, no camera delay."""
    rows = [r for r in (record.get('lockstep') or {}).get('rows', [])
            if r['relax_threshold'] == 0 and r.get('camera_delay', 0) == 0
            and r.get('model', record.get('model')) == record.get('model')]
    ar = next((r for r in rows if r['mode'] == 'ar'), None)
    default = next((r for r in rows if r['mode'] == default_mode), None) \
        if default_mode else None
    return ar, default


def _pair(ar, default, key: str, digits: int) -> str:
    """'AR / default' of one field ('-' where a row or its value is missing)."""
    cell = [fmt(measured(r.get(key)), digits) if r is not None else '-' for r in (ar, default)]
    return ' / '.join(cell)


def format_rollup(records: list[dict]) -> str:
    """The closing table of a chain of demo records (first model first); '' for one record."""
    if len(records) < 2:
        return ''
    head = ['model', 'default mode', 'p50 ms AR / default', '×AR p50',
            'p99 ms AR / default', 'frames answered AR / default',
            'forwards/action AR / default', 'success AR / default']
    rows = []
    for record in records:
        ar, stream = stream_rows(record)
        default = next((r for r in stream if r.get('is_default')), None)
        mode = default['mode'] if default is not None else None
        ratio = (measured(default['latency_p50_ms']) / measured(ar['latency_p50_ms'])
                 if ar is not None and default is not None else None)
        lock_ar, lock_default = _lockstep_pair(record, mode)
        rows.append([record.get('model', '-'), mode or '-',
                     _pair(ar, default, 'latency_p50_ms', 1), fmt(ratio),
                     _pair(ar, default, 'latency_p99_ms', 1),
                     _pair(ar, default, 'answered_fraction', 2),
                     _pair(ar, default, 'forwards_per_action', 2),
                     _pair(lock_ar, lock_default, 'success_rate', 2)])
    return f'{ROLLUP_TITLE}:\n\n' + markdown_table(head, rows)


__all__ = ['ROLLUP_TITLE', 'format_rollup']
