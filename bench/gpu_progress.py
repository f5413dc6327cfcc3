"""What a run of bench/gpu.py cut short still leaves behind (``--progress-file``).

A GPU command runs under a hard time limit, and the table and paced parts write their JSON
record only at the end. The progress file is rewritten after every timed row with what the run
has so far, in the final record's own keys, so that bench/gpu_verdicts.py reads it the same way:

- ``rows``: the table's rows as timed (``label``, ``graphs``, ``streams``, the ``BenchRow``
  fields with the row's name as ``mode``, and ``ms_per_action``; the baselines' ratios are
  filled in only at the end);
- ``paced``: the paced part so far (``floor_ms``, ``pieces_ms``, the finished ``rows``).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path


class ProgressFile:
    """Rewrites ``path`` (nothing when it is empty) after each ``add_row`` / ``set_paced``."""

    def __init__(self, path: str):
        self.path = Path(path) if path else None
        self.rows: list[dict] = []
        self.paced: dict = {}

    def add_row(self, label: str, row, graphs: bool, streams: int) -> None:
        self.rows.append({'label': label, 'graphs': graphs, 'streams': streams, **asdict(row),
                          'ms_per_action': 1e3 / row.actions_per_s})
        self._write()

    def set_paced(self, paced: dict) -> None:
        self.paced = paced
        self._write()

    def _write(self) -> None:
        """Written to a temporary file and renamed over the last one: a run killed by its time
        limit mid-write leaves the previous complete file, never half of one."""
        if self.path is not None:
            partial = self.path.with_name(self.path.name + '.partial')
            partial.write_text(json.dumps({'rows': self.rows, 'paced': self.paced}, indent=1))
            os.replace(partial, self.path)


def progress_record(data) -> dict:
    """A progress file's contents as a record for bench/gpu_verdicts.py. Files written before
    the progress file held the paced part are a plain list of table rows whose graph setting
    is only in the label (``... graphs=True streams=1``)."""
    if isinstance(data, dict):
        return data
    rows = [{**row, 'graphs': 'graphs=True' in row['label'],
             'streams': int(row['label'].partition('streams=')[2] or 1),
             'ms_per_action': 1e3 / row['actions_per_s']} for row in data]
    return {'rows': rows, 'paced': {}}
