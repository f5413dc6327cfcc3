"""pi0-FAST's entry in the registry table (models/family.py says what an entry holds).

A folder is pi0-FAST's when its config.json has LeRobot's ``type`` "pi0_fast" (or the older
"pi0fast"): checkpoint.is_pi0fast_config. Its checkpoints decode chunks of ``chunk_size``
control steps (LeRobot's name), which the node blends best with ACT's temporal ensemble
(``chunk_blend`` ensemble: docs/demo.md). Hooks import the family's modules when called, so
the table costs no torch import.
"""
from __future__ import annotations

from ..family import Family, LoadedModel
from .config import DEFAULT_DRAFT, DEMO_PRESET, LEROBOT_TYPES, PRESETS, Pi0FastConfig

NAME = 'pi0fast'
# make_checkpoint's options beyond the preset: another camera count, image size or state size
# (family.configure) and the decodable test aid (decodable.py).
CHECKPOINT_OPTIONS = ('num_image_slots', 'image_size', 'state_dim', 'decodable_chunks')


def detects(raw: dict) -> bool:
    from .checkpoint import is_pi0fast_config
    return is_pi0fast_config(raw)


def load(folder, dtype, device, max_instruction_tokens: int) -> LoadedModel:
    from .family import load as load_folder
    model, cfg, raw, prompt, norm_stats = load_folder(folder, dtype, device,
                                                      max_instruction_tokens)
    return LoadedModel(model, cfg, raw, prompt, model.action_codec(), NAME, norm_stats)


def make_checkpoint(preset_name: str, out, seed: int = 0, dtype: str = 'float32', *,
                    num_image_slots: int | None = None, image_size: int | None = None,
                    state_dim: int | None = None, decodable_chunks: bool = False):
    """A random-weight checkpoint in LeRobot's layout (family.make_random), of the preset with
    ``num_image_slots``, ``image_size`` or ``state_dim`` replaced (None keeps the preset's);
    ``decodable_chunks``: greedy decoding writes a valid FAST frame (a test aid)."""
    from .family import configure, make_random
    cfg = configure(preset_name, num_image_slots=num_image_slots, image_size=image_size,
                    state_dim=state_dim)
    return make_random(cfg, out, seed=seed, dtype=dtype, decodable_chunks=decodable_chunks)


def action_chunk(raw: dict) -> int:
    return int(raw.get('chunk_size') or 1)


def baseline(runner, engine_config, variant: str = 'eager'):
    """The transformers baseline on the runner's weights (baseline.py here)."""
    from .baseline import make_baseline
    return make_baseline(runner, engine_config, variant)


def demo_recipe(cfg, demos, out):
    """Demo training's hooks (demo_training.py here; train/demo_training.py runs them)."""
    from .demo_training import DemoRecipe
    return DemoRecipe(cfg, demos, out)


FAMILY = Family(
    name=NAME, config_class=Pi0FastConfig, presets=PRESETS, detects=detects, load=load,
    make_checkpoint=make_checkpoint, checkpoint_options=CHECKPOINT_OPTIONS,
    action_chunk=action_chunk, default_draft=DEFAULT_DRAFT, baseline=baseline,
    demo_recipe=demo_recipe, demo_preset=DEMO_PRESET,
    node_settings={'chunk_blend': 'ensemble'}, lerobot_types=LEROBOT_TYPES)

__all__ = ['FAMILY', 'NAME']
