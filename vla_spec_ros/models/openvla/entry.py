"""OpenVLA's entry in the registry table (models/family.py says what an entry holds).

OpenVLA is the default family: a folder whose config.json no other family claims is read in
OpenVLA's Hugging Face layout (the layout this package has always read). Its checkpoints
decode ``action_chunk`` control steps per frame (config.json; 1 when absent). Hooks import
the family's modules when called, so the table costs no torch import.
"""
from __future__ import annotations

from ..family import Family, LoadedModel
from .config import DEFAULT_DRAFT, DEMO_PRESET, PRESETS, VLAConfig

NAME = 'openvla'
ARCHITECTURE = 'OpenVLAForActionPrediction'     # config.json's architectures (Hugging Face)


def detects(raw: dict) -> bool:
    """config.json of OpenVLA's Hugging Face port (``model_type`` "openvla" or its
    architecture)."""
    return raw.get('model_type') == NAME or ARCHITECTURE in (raw.get('architectures') or ())


def load(folder, dtype, device, max_instruction_tokens: int) -> LoadedModel:
    from .checkpoint import load_model
    from .prompt import PromptTokenizer, check_tokenizer_fits
    model, cfg, raw = load_model(folder, dtype, device)
    tokenizer = PromptTokenizer.from_folder(folder, max_instruction_tokens)
    check_tokenizer_fits(tokenizer, cfg)
    return LoadedModel(model, cfg, raw, tokenizer, model.action_codec(), NAME)


def make_checkpoint(preset_name: str, out, seed: int = 0, dtype: str = 'float32',
                    max_shard_bytes: int | None = None):
    """A random-weight checkpoint in OpenVLA's exact layout (random_checkpoint.py);
    ``max_shard_bytes`` shards the weights."""
    from .random_checkpoint import make_checkpoint as make_random
    return make_random(preset_name, out, seed=seed, dtype=dtype,
                       max_shard_bytes=max_shard_bytes)


def action_chunk(raw: dict) -> int:
    return int(raw.get('action_chunk') or 1)


def baseline(runner, engine_config, variant: str = 'eager'):
    """The transformers baseline on the runner's weights (baseline.py here)."""
    from .baseline import make_baseline
    return make_baseline(runner, engine_config, variant)


def demo_recipe(cfg, demos, out):
    """Demo training's hooks (demo_training.py here; train/demo_training.py runs them)."""
    from .demo_training import DemoRecipe
    return DemoRecipe(cfg, demos, out)


def fidelity():
    """vla-spec fidelity's stages (fidelity.py here)."""
    from .fidelity import HOOKS
    return HOOKS


FAMILY = Family(
    name=NAME, config_class=VLAConfig, presets=PRESETS, detects=detects, load=load,
    make_checkpoint=make_checkpoint, checkpoint_options=('max_shard_bytes',),
    action_chunk=action_chunk, default_draft=DEFAULT_DRAFT, baseline=baseline,
    demo_recipe=demo_recipe, demo_preset=DEMO_PRESET, trains_draft_head=True, fidelity=fidelity,
    is_default=True)

__all__ = ['FAMILY', 'NAME']
