"""Where ``train-draft`` may write its head: ``--out`` receives ``config.json`` and
``model.safetensors`` (models/draft.save_draft), replacing whatever files of those names are
there. That is right for a folder that holds a draft head already (retraining a head in place is
normal) and data loss for anything else: a model checkpoint (``--out`` = ``--model``, or
another checkpoint), whose config.json and weights would become a draft head's.

What a folder holds is decided by its contents, not its name: a draft head's weights carry only
``fc.*`` / ``layers.*`` keys (and EAGLE / Spec-VLA's unused copy of the token embedding), and
save_draft's config.json names the ``EagleDraftHead`` architecture.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..models.draft import EMBED_KEY
from ..models.weights import CheckpointError, _check_safetensors_file

# The architecture save_draft writes into a draft head's config.json (DraftConfig.to_json).
DRAFT_ARCHITECTURE = 'EagleDraftHead'
DRAFT_KEY_PREFIXES = ('fc.', 'layers.')
WEIGHTS_FILE = 'model.safetensors'
SHARD_INDEX_FILE = 'model.safetensors.index.json'
CONFIG_FILE = 'config.json'


def _is_draft_key(key: str) -> bool:
    return key.startswith(DRAFT_KEY_PREFIXES) or key == EMBED_KEY


def _names_the_draft_architecture(config: Path) -> bool:
    try:
        raw = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and DRAFT_ARCHITECTURE in (raw.get('architectures') or ())


def _weights_problem(weights: Path) -> str | None:
    """Why ``weights`` is not a draft head's (None when every key is one)."""
    try:
        keys = _check_safetensors_file(weights)
    except CheckpointError as exc:
        return f'holds a {weights.name} that is not a readable draft head ({exc})'
    others = sorted(key for key in keys if not _is_draft_key(key))
    if others:
        return (f'holds model weights ({weights.name} has key {others[0]}; a draft head\'s '
                'are fc.* and layers.*)')
    return None


def not_a_draft_head(out: Path, model_folder: Path | None = None) -> str | None:
    """Why writing a draft head into ``out`` would destroy something (None: it is absent,
    holds no config.json / weights, or holds a draft head)."""
    if not out.is_dir():
        return None                     # absent (made), or a file (save_draft's mkdir refuses)
    if model_folder is not None and out.resolve() == Path(model_folder).resolve():
        return 'is the --model checkpoint folder'
    if (out / SHARD_INDEX_FILE).exists():
        return f'holds sharded model weights ({SHARD_INDEX_FILE})'
    if (out / WEIGHTS_FILE).exists():
        return _weights_problem(out / WEIGHTS_FILE)
    config = out / CONFIG_FILE
    if config.exists() and not _names_the_draft_architecture(config):
        return (f'holds a {CONFIG_FILE} that is not a draft head\'s (no "architectures": '
                f'["{DRAFT_ARCHITECTURE}"])')
    return None


def check_draft_out(out: Path, model_folder: Path | None, force: bool) -> None:
    """ValueError naming ``--out`` when writing a draft head there would overwrite a model's
    files (``not_a_draft_head``), unless ``force``."""
    problem = None if force else not_a_draft_head(Path(out), model_folder)
    if problem is not None:
        raise ValueError(f'--out: {out} {problem}; writing the draft head there would replace '
                         f'its {CONFIG_FILE} and {WEIGHTS_FILE}. Give a new folder (a '
                         'checkpoint\'s own head goes in <checkpoint>/draft) or a draft head\'s '
                         'folder, or add --force to overwrite it')


__all__ = ['DRAFT_ARCHITECTURE', 'check_draft_out', 'not_a_draft_head']
