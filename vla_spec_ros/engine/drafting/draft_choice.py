"""Which drafter an engine's ``draft_path`` selects, loaded and ready for the engine.

- ``"previous_action"``: a ``PreviousActionDrafter`` (temporal drafting: each stream's previous
  action, no draft model, works with every checkpoint, and its draft rides the prefill:
  engine/packed.py, speculative prefill);
- ``"previous_output"``: a ``PreviousOutputDrafter`` (lookup drafting: the stream's previous
  output re-anchored by context after each mismatch, for long variable-length outputs such
  as a reasoning policy's text; rides the prefill too);
- ``"shifted_chunk"`` / ``"shifted_chunk_linear"``: a ``ShiftedChunkDrafter`` (a chunk codec's
  previous chunk shifted by the control steps that passed, its end held or continued, and
  re-encoded through the codec; no draft model, rides the prefill too);
- headless names joined by ``+`` (``"shifted_chunk+previous_action"``): their chains merged
  into one tree (engine/drafting/merged_chains.py), the first one the prefill draft;
- None (the default): the model config's ``default_draft`` (a family or checkpoint states the
  draft that predicts its tokens best; ``"previous_action"`` when the config has none);
- a draft folder (EAGLE / Spec-VLA layout, models/draft.py), or ``"checkpoint"`` for the
  checkpoint's own ``draft/`` folder: an ``EagleDrafter`` running that head;
- ``"random"``: an ``EagleDrafter`` over a seeded random head (a deliberately poor draft, for
  tests and demos).

With ``draft_previous_action`` a draft head's trees get the previous action merged in
(engine/drafting/temporal_merge.py).
"""
from __future__ import annotations

import os
from pathlib import Path

from ...config import EngineConfig
from ...models.draft import (CHECKPOINT_DRAFT, DEFAULT_DRAFT_SUBFOLDER, RANDOM_DRAFT, load_draft,
                             new_draft_head)
from ...models.layers import fuse_projections
from ...models.weights import CheckpointError
from .drafter import Drafter
from .eagle_drafter import EagleDrafter
from .merged_chains import DRAFT_SEPARATOR, MergedChains
from .previous_action_drafter import PREVIOUS_ACTION_DRAFT, PreviousActionDrafter
from .previous_output_drafter import PREVIOUS_OUTPUT_DRAFT, PreviousOutputDrafter
from .shifted_chunk_drafter import (SHIFTED_CHUNK_DRAFT, SHIFTED_CHUNK_LINEAR_DRAFT,
                                    ShiftedChunkDrafter)
from .temporal_merge import WithPreviousAction


HEADLESS_DRAFTS = (PREVIOUS_ACTION_DRAFT, PREVIOUS_OUTPUT_DRAFT, SHIFTED_CHUNK_DRAFT,
                   SHIFTED_CHUNK_LINEAR_DRAFT)


def default_draft_path(runner) -> str:
    """The draft the model names (the protocol's ``default_draft``: a family sets it from its
    measurements, a checkpoint's config may override it), else the previous action. Only
    drafts without a head may be defaults: a default must work with every checkpoint."""
    model = getattr(runner, 'model', None)
    path = getattr(model, 'default_draft', None) or PREVIOUS_ACTION_DRAFT
    if not is_headless(path):
        raise ValueError(f'default_draft: {path!r} is not one of {HEADLESS_DRAFTS} (or '
                         f'several joined by "{DRAFT_SEPARATOR}")')
    return path


def is_headless(path: str) -> bool:
    return all(part in HEADLESS_DRAFTS for part in str(path).split(DRAFT_SEPARATOR))


def headless_drafter(runner, path: str) -> Drafter:
    """A drafter without a head by name (``HEADLESS_DRAFTS``, or several joined by ``+``)."""
    parts = path.split(DRAFT_SEPARATOR)
    if len(parts) > 1:
        return MergedChains([headless_drafter(runner, part) for part in parts])
    if path == PREVIOUS_ACTION_DRAFT:
        codec = runner.codec        # a codec that does not say is positional (the protocol's)
        positional = getattr(codec, 'positional_drafts', True)
        return PreviousActionDrafter(runner.max_action_tokens, codec.step_tokens,
                                     None if positional else codec.continue_draft)
    if path == PREVIOUS_OUTPUT_DRAFT:
        return PreviousOutputDrafter(runner.max_action_tokens,
                                     runner.codec.max_draft_chain)
    return ShiftedChunkDrafter(runner.codec, runner.max_action_tokens,
                               'linear' if path == SHIFTED_CHUNK_LINEAR_DRAFT else 'hold')


def check_draft_path(path: str | None, checkpoint_folder: str | os.PathLike | None) -> None:
    """ValueError (CheckpointError for a missing folder) unless ``path`` names a drafter that
    can load: None, a headless name (or several joined by ``+``), ``"random"``,
    ``"checkpoint"`` over a checkpoint with a ``draft/`` folder, or an existing folder.
    Checked in every mode, the ones that do not draft included: a mistyped path is refused
    where it is written, not when the mode is changed to a speculative one (nothing is
    loaded here; ``load_draft_for`` checks the head itself)."""
    if path is None or path == RANDOM_DRAFT or is_headless(path):
        return
    if path == CHECKPOINT_DRAFT:
        default = Path(checkpoint_folder) / DEFAULT_DRAFT_SUBFOLDER \
            if checkpoint_folder is not None else None
        if default is None or not default.is_dir():
            raise ValueError(f'draft_path: "{CHECKPOINT_DRAFT}" names the checkpoint\'s '
                             f'{DEFAULT_DRAFT_SUBFOLDER}/ folder, but {checkpoint_folder} has '
                             f'none; set draft_path to a draft folder, "{RANDOM_DRAFT}" or '
                             f'"{PREVIOUS_ACTION_DRAFT}" (the default, no draft model)')
        return
    if not Path(path).expanduser().is_dir():
        raise CheckpointError(f'draft_path: {path!r} does not exist: it is neither a draft '
                              f'folder nor one of '
                              f'{", ".join(HEADLESS_DRAFTS)} (several may be joined by '
                              f'"{DRAFT_SEPARATOR}"), "{CHECKPOINT_DRAFT}" or "{RANDOM_DRAFT}"')


def _verifier_name(checkpoint_folder: str | os.PathLike | None) -> str:
    """How a draft head's errors name the verifier: its checkpoint folder when known."""
    return str(checkpoint_folder) if checkpoint_folder is not None else 'this verifier'


def load_draft_for(runner, engine_config: EngineConfig,
                   checkpoint_folder: str | os.PathLike | None) -> Drafter:
    """``EngineConfig.draft_path`` -> the drafter for an engine over ``runner``'s verifier.

    draft_path: None (``default_draft_path(runner)``); ``"previous_action"`` (temporal
    drafting, no head); ``"shifted_chunk"`` or ``"shifted_chunk_linear"``; headless names
    joined by ``+``; a draft folder;
    ``"checkpoint"``, meaning ``<checkpoint_folder>/draft/`` (refused when that folder does
    not exist); ``"random"`` (a seeded random head from ``engine_config.seed``: a
    deliberately poor draft for tests and demos).
    """
    path = engine_config.draft_path
    if path is None:
        path = default_draft_path(runner)
    if is_headless(path):
        return headless_drafter(runner, path)
    check_draft_path(path, checkpoint_folder)
    if path == CHECKPOINT_DRAFT:
        path = str(Path(checkpoint_folder) / DEFAULT_DRAFT_SUBFOLDER)
    if path == RANDOM_DRAFT:
        head = new_draft_head(runner.model, seed=engine_config.seed, dtype=runner.dtype,
                              device=runner.device)
    else:
        head = load_draft(Path(path).expanduser(), runner.model, runner.dtype, runner.device,
                          verifier_name=_verifier_name(checkpoint_folder))
    if runner.device.type == 'cuda':
        fuse_projections(head)      # q/k/v and gate/up: one product each, as the verifier's
    drafter = EagleDrafter.for_engine(runner, head, engine_config)
    if engine_config.draft_previous_action:
        return WithPreviousAction(drafter, runner.max_action_tokens, runner.codec.step_tokens)
    return drafter


__all__ = ['HEADLESS_DRAFTS', 'check_draft_path', 'default_draft_path', 'headless_drafter',
           'is_headless', 'load_draft_for']
