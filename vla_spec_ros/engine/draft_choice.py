"""Which drafter an engine's ``draft_path`` selects, loaded and ready for the engine.

- a draft folder (EAGLE / Spec-VLA layout, models/draft.py), or None for the checkpoint's own
  ``draft/`` folder: an ``EagleDrafter`` running that head;
- ``"random"``: an ``EagleDrafter`` over a seeded random head (a deliberately poor draft, for
  tests and demos);
- ``"previous_action"``: a ``PreviousActionDrafter`` (temporal drafting: each stream's
  previous action, no draft model).

With ``draft_previous_action`` a draft head's trees get the previous action merged in
(engine/temporal_merge.py).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..config import EngineConfig
from ..models.draft import DEFAULT_DRAFT_SUBFOLDER, RANDOM_DRAFT, load_draft, new_draft_head
from ..models.layers import fuse_projections
from .drafter import Drafter
from .eagle_drafter import EagleDrafter
from .previous_action_drafter import PREVIOUS_ACTION_DRAFT, PreviousActionDrafter
from .temporal_merge import WithPreviousAction


def load_draft_for(runner, engine_config: EngineConfig,
                   checkpoint_folder: str | os.PathLike | None) -> Drafter:
    """``EngineConfig.draft_path`` -> the drafter for an engine over ``runner``'s verifier.

    draft_path: a draft folder; ``"random"`` (a seeded random head from ``engine_config.seed``:
    a deliberately poor draft for tests and demos); ``"previous_action"`` (temporal
    drafting, no head); or None, meaning ``<checkpoint_folder>/draft/`` when that folder
    exists.
    """
    path = engine_config.draft_path
    if path == PREVIOUS_ACTION_DRAFT:
        return PreviousActionDrafter(runner.action_dim)
    if path is None:
        default = Path(checkpoint_folder) / DEFAULT_DRAFT_SUBFOLDER \
            if checkpoint_folder is not None else None
        if default is None or not default.is_dir():
            raise ValueError(f'draft_path: mode {engine_config.mode!r} needs a draft head; set '
                             f'draft_path to a draft folder, "{RANDOM_DRAFT}" or '
                             f'"{PREVIOUS_ACTION_DRAFT}" (no '
                             f'{DEFAULT_DRAFT_SUBFOLDER}/ folder in {checkpoint_folder})')
        path = str(default)
    if path == RANDOM_DRAFT:
        head = new_draft_head(runner.model, seed=engine_config.seed, dtype=runner.dtype,
                              device=runner.device)
    else:
        head = load_draft(Path(path).expanduser(), runner.model, runner.dtype, runner.device)
    if runner.device.type == 'cuda':
        fuse_projections(head)      # q/k/v and gate/up: one product each, as the verifier's
    drafter = EagleDrafter.for_engine(runner, head, engine_config)
    if engine_config.draft_previous_action:
        return WithPreviousAction(drafter, runner.action_dim)
    return drafter


__all__ = ['load_draft_for']
