"""Checkpoints shipped inside the package (the embedded default model lives here)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent


def embedded_names() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if (p / 'config.json').is_file())


def embedded_checkpoint(name: str) -> Path | None:
    folder = ROOT / name
    return folder if (folder / 'config.json').is_file() else None
