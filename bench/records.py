"""Where a bench script's run is kept: its table as Markdown and, when given, its data as JSON,
side by side under the results folder with the time in their names; and the rows a bench
compares, each a mode with EngineConfig options (`parse_row`)."""
from __future__ import annotations

import json
import time
from pathlib import Path


def write_record(out, name: str, text: str, data: dict | None = None) -> Path:
    """``<out>/<name>-<YYYYmmdd-HHMMSS>.md`` holding ``text`` (and ``.json`` holding ``data``);
    returns the Markdown file's path and says where it went."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f'{name}-{time.strftime("%Y%m%d-%H%M%S")}'
    stem.with_suffix('.md').write_text(text + '\n')
    if data is not None:
        stem.with_suffix('.json').write_text(json.dumps(data, indent=1, default=str))
    print(f'written {stem}.md')
    return stem.with_suffix('.md')


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {'true': True, 'false': False}.get(text.lower(), text)


def parse_row(text: str) -> tuple[str, dict]:
    """'ar' -> ('ar', {'mode': 'ar'}); 'ps1=pipeline_spec:max_inflight_per_stream=1' ->
    ('ps1', {'mode': 'pipeline_spec', 'max_inflight_per_stream': 1})."""
    label, _, rest = text.partition('=') if ':' in text else (text, '', text)
    mode, *options = rest.split(':')
    parsed = {'mode': mode}
    for option in options:
        name, _, value = option.partition('=')
        parsed[name] = _value(value)
    return label, parsed
