"""The transformers AR baseline: the anchor every speed ratio is measured against.

``make_baseline`` returns the baseline of the runner's family (models/registry.py): OpenVLA's
``HFBaseline`` (models/openvla/baseline.py: transformers' Llama on our prompt embeddings, an
eager and a compiled variant) or pi0-FAST's ``PaliGemmaBaseline`` (models/pi0fast/baseline.py:
transformers' PaliGemma, eager). A family's baseline decodes a frame (``generate_frame``) on
the runner it was built on; this module, above the engine, builds the frames and times them.
"""
from __future__ import annotations

import time

from .engine.result import Frame
from .models import registry


def make_baseline(runner, engine_config, variant: str = 'eager'):
    """The transformers baseline of the runner's family (``variant``: eager, or a variant the
    family offers; ValueError naming it otherwise)."""
    family = registry.family_of_config(runner.cfg)
    if family.baseline is None:
        raise ValueError(f'model: the {family.name} family has no transformers baseline')
    return family.baseline(runner, engine_config, variant)


def generate_tokens(baseline, image, instruction: str) -> list[int]:
    """The baseline's tokens for an image and an instruction alone (a ``Frame`` of just them:
    the family's default state, if it reads one)."""
    return baseline.generate_frame(Frame(image, instruction))


def timed(baseline, image, instruction: str) -> tuple[list[int], float]:
    """``generate_tokens`` and its wall time in seconds."""
    start = time.perf_counter()
    tokens = generate_tokens(baseline, image, instruction)
    return tokens, time.perf_counter() - start


__all__ = ['make_baseline', 'generate_tokens', 'timed']
