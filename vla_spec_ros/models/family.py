"""What a model family is to the rest of the package: one ``Family`` record, the entry its
folder registers in ``models/registry.py`` (``models/<family>/entry.py`` defines it).

The record holds the family's facts and hooks, nothing else: its config class and presets,
how to recognise its checkpoints (``detects``: config.json -> bool), how to load one and how
to write a random-weight one, what its checkpoints say about chunks, its default draft and
the node settings it recommends, and the optional hooks of the tools (the transformers
baseline, demo training, fidelity). Every hook is a plain callable that imports the family's
heavy modules when it is called, so reading the table (preset names, detection) costs no
torch import. Code outside ``models/<family>/`` reaches a family only through its record
(``test/test_family_boundaries.py``); the engine never does (it sees ``models/protocol``).
Plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass
class LoadedModel:
    """What a runner needs: the model, its config, config.json, its prompt builder and its
    action codec; ``norm_stats``: the dataset statistics when the family keeps them outside
    config.json (pi0-FAST: LeRobot's processor files), else None."""

    model: Any
    cfg: Any
    raw: dict
    tokenizer: Any
    codec: Any
    family: str
    norm_stats: dict | None = None


@dataclass(frozen=True)
class FidelityHooks:
    """What ``vla-spec fidelity`` compares for a family, stage by stage.

    ``image_size(raw)``: the model's image side from config.json, without loading it.
    ``reference_pixels(image, size, center_crop, rotate_180)``: the uint8 (S, S, 3) pixels of
    the family's reference processor, written out on its own (not through the engine).
    ``levels(pixels, cfg)``: the engine's normalised pixels (C, S, S) -> the uint8 levels
    (S, S, 3) they encode, to compare with the reference's.
    ``stages(model, pixels)``: the vision stages of normalised pixels (1, C, S, S), by name in
    data-path order (OpenVLA: the towers' features, the projected patches).
    """

    image_size: Callable[[dict], int]
    reference_pixels: Callable[..., Any]
    levels: Callable[..., Any]
    stages: Callable[..., dict]


@dataclass(frozen=True)
class Family:
    """One model family's entry in the registry table (module docstring).

    ``load(folder, dtype, device, max_instruction_tokens) -> LoadedModel``;
    ``make_checkpoint(preset_name, out, seed=, dtype=, **options) -> Path`` with the options
    named in ``checkpoint_options`` (the registry refuses any other, naming it);
    ``action_chunk(raw)``: control steps one frame decodes, read from config.json;
    ``default_draft``: the spec modes' drafter when ``draft_path`` is unset (a headless
    drafter's name, engine/drafting/draft_choice.py; the family's models report the same);
    ``node_settings``: node parameters the family recommends (a chunked family's
    ``chunk_blend``); ``is_default``: the family that takes a folder no other family claims
    (exactly one). Optional tools: ``baseline(runner, engine_config, variant)`` (the
    transformers reference), ``demo_recipe(cfg, demos, out)`` (demo training's hooks,
    train/demo_training.py) with ``demo_preset`` (the preset it trains: its image size is the
    demonstrations') and ``trains_draft_head`` (an EAGLE head after it), and ``fidelity``
    (-> its ``FidelityHooks``, imported when asked); ``lerobot_types``: the LeRobot policy
    types it reads (config.json's ``type``).
    """

    name: str
    config_class: type
    presets: Mapping[str, Callable[[], Any]]
    detects: Callable[[dict], bool]
    load: Callable[..., LoadedModel]
    make_checkpoint: Callable[..., Any]
    action_chunk: Callable[[dict], int]
    default_draft: str
    checkpoint_options: tuple[str, ...] = ()
    node_settings: Mapping[str, Any] = field(default_factory=dict)
    is_default: bool = False
    baseline: Callable[..., Any] | None = None
    demo_recipe: Callable[..., Any] | None = None
    demo_preset: str = ''
    trains_draft_head: bool = False
    fidelity: Callable[[], FidelityHooks] | None = None
    # LeRobot policy types (config.json's "type") the family reads; the registry refuses a
    # LeRobot folder of a type no family lists, by name, instead of guessing its family.
    lerobot_types: tuple[str, ...] = ()

    def __post_init__(self):
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise ValueError(f'name: a family is named by its folder under models/, got '
                             f'{self.name!r}')
        if not self.presets:
            raise ValueError(f'presets: family {self.name!r} names no preset')
        if self.demo_recipe is not None and self.demo_preset not in self.presets:
            raise ValueError(f'demo_preset: {self.demo_preset!r} is not one of family '
                             f'{self.name!r}\'s presets {sorted(self.presets)}')
        if not (isinstance(self.default_draft, str) and self.default_draft):
            raise ValueError(f'default_draft: family {self.name!r} gives '
                             f'{self.default_draft!r}, not a drafter name')


__all__ = ['Family', 'FidelityHooks', 'LoadedModel']
