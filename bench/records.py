"""Where a bench script's run is kept: its table as Markdown and, when given, its data as JSON,
side by side under the results folder with the time in their names."""
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
