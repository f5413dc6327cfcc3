"""ECoT's entry in the registry table (models/family.py says what an entry holds).

A folder is ECoT's when its config.json names Prismatic's Vicuna v1.5 backbone
(``llm_backbone_id`` "vicuna-v15-7b", the released ``ecot-openvla-7b-bridge``), or says so
itself (``vla_spec_family``: "ecot"). Hooks import the family's modules when called.
"""
from __future__ import annotations

from ..family import Family
from .config import DEFAULT_DRAFT, DEMO_PRESET, PRESETS, EcotConfig

NAME = 'ecot'


def detects(raw: dict) -> bool:
    return raw.get('vla_spec_family') == NAME or str(
        raw.get('llm_backbone_id', '')).startswith('vicuna')


def load(folder, dtype, device, max_instruction_tokens: int):
    from .checkpoint import load_model
    return load_model(folder, dtype, device, max_instruction_tokens)


def make_checkpoint(preset_name, out, seed: int = 0, dtype: str = 'float32',
                    scripted_reasoning: bool = False):
    """A random-weight ECoT checkpoint; ``scripted_reasoning``: the test aid of scripted.py."""
    from .checkpoint import make_checkpoint as make_random
    return make_random(preset_name, out, seed=seed, dtype=dtype,
                       scripted_reasoning=scripted_reasoning)


def action_chunk(raw: dict) -> int:
    return 1


def baseline(runner, engine_config, variant: str = 'eager'):
    """The transformers baseline, decoding until the action is done (baseline.py here)."""
    from .baseline import make_baseline
    return make_baseline(runner, engine_config, variant)


def demo_recipe(cfg, demos, out):
    """Demo training's hooks (demo_training.py here; train/demo_training.py runs them)."""
    from .demo_training import DemoRecipe
    return DemoRecipe(cfg, demos, out)


FAMILY = Family(
    name=NAME, config_class=EcotConfig, presets=PRESETS, detects=detects, load=load,
    make_checkpoint=make_checkpoint, checkpoint_options=('scripted_reasoning',),
    action_chunk=action_chunk, default_draft=DEFAULT_DRAFT, baseline=baseline,
    demo_recipe=demo_recipe, demo_preset=DEMO_PRESET)

__all__ = ['FAMILY', 'NAME']
