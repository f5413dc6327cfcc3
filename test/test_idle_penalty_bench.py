"""bench/idle_penalty.py's host parts: the pause kinds, an operation's p50 after a pause, and
part 1's table (one column per pause and kind, a row per operation)."""
import time

import pytest

from bench_scripts import load_bench


@pytest.fixture(scope='module')
def idle_penalty():
    return load_bench('idle_penalty')


@pytest.mark.parametrize('how', ['sleep', 'spin'])
def test_a_pause_lasts_at_least_its_length(idle_penalty, how):
    start = time.perf_counter()
    idle_penalty.pause(0.01, how)
    assert time.perf_counter() - start >= 0.01


def test_op_after_pause_runs_the_op_once_per_repeat_after_its_pause(idle_penalty):
    calls = []
    p50 = idle_penalty.op_after_pause(lambda: calls.append(time.perf_counter()), 0.002,
                                      'spin', repeats=5)
    assert len(calls) == 5 and p50 >= 0.0
    assert all(b - a >= 0.002 for a, b in zip(calls, calls[1:]))     # each after its pause


def test_part_one_has_a_column_per_pause_and_kind_and_a_row_per_operation(
        idle_penalty, monkeypatch):
    monkeypatch.setattr(idle_penalty, 'REPEATS', 3)
    lines = idle_penalty.part_one([0.0, 1.0])
    header, rule, *rows = lines[2:]
    assert header == '| operation | 0 ms sleep | 1 ms sleep | 1 ms spin |'
    assert rule == '|---|---|---|---|'
    assert len(rows) == len(idle_penalty.small_operations())
    for row in rows:
        cells = row.strip('|').split('|')
        assert len(cells) == 4 and all(float(c) >= 0.0 for c in cells[1:])


def test_bad_gaps_are_refused(idle_penalty, capsys):
    with pytest.raises(SystemExit):
        idle_penalty.main(['--gaps', 'five', '--skip-model'])
    assert '--gaps' in capsys.readouterr().err
