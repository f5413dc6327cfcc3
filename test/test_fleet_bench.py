"""bench/fleet.py's tables, on rows of the shape its runs return (no node, no DDS)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'bench'))

from fleet import NODE_STAGES, stage_table  # noqa: E402


def _row(robots, mode, steps_p99, gc=None):
    stages = {f'{stage}_p{q}_ms': 1.0 for stage in NODE_STAGES for q in (50, 99)}
    row = {'robots': robots, 'mode': mode,
           'node_stages_ms': {'r0': dict(stages, steps_p99_ms=steps_p99),
                              'r1': dict(stages, steps_p99_ms=steps_p99 / 2)}}
    if gc is not None:
        row['gc'] = gc
    return row


def test_stage_table_shows_the_worst_robot_and_the_collection_pauses():
    text = stage_table([
        _row(2, 'pipeline_spec', 25.2, {'pause_max_ms': 0.2, 'full_collections_max_window': 0}),
        _row(1, 'ar', 30.0, {'pause_max_ms': 151.0, 'full_collections_max_window': 1})])
    lines = text.splitlines()
    assert lines[2] == '| 2 | pipeline_spec | 1.0 / 1.0 | 1.0 / 1.0 | 1.0 / 1.0 | 1.0 / 25.2 ' \
                       '| 1.0 / 1.0 |'
    assert lines[-1].endswith('2 robot(s) pipeline_spec: longest pause 0.2 ms, up to 0 full '
                              'collection(s) in one window; 1 robot(s) ar: longest pause '
                              '151.0 ms, up to 1 full collection(s) in one window')


def test_stage_table_of_rows_recorded_before_the_pauses_has_no_pause_line():
    assert 'Garbage' not in stage_table([_row(1, 'ar', 3.0)])
