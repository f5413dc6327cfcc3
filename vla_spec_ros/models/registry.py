"""The model families, as one table: which family a checkpoint folder holds, loading it,
random-weight checkpoints of a preset, presets by name, and each family's tools (its baseline,
demo training, fidelity, default draft, recommended node settings). Everything that needs a
family's own code asks here: ``policy.VLAPolicy.from_pretrained``, ``vla-spec
make-checkpoint``, ``baseline.make_baseline``, the demo, fidelity and demo training. The engine
never does (it sees ``models/protocol``).

A family is a folder under models/ whose ``entry.py`` defines its ``Family`` record
(models/family.py); it joins the table with one line in ``FAMILY_FOLDERS`` below, its folder's
name (as vLLM's registry names a model's module). Detection: the
families whose ``detects`` accept a folder's config.json; more than one is an error, none
means the default family (OpenVLA: the layout this package has always read). Reading the
table and the presets imports no torch (the records' hooks import their family's modules when
called; detection may).
"""
from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from .family import Family, LoadedModel

# The registry table: one line per family, the name of its folder under models/.
FAMILY_FOLDERS = (
    'openvla',
    'pi0fast',
    'ecot',
)


def _entry(folder: str) -> Family:
    family = import_module(f'{__package__}.{folder}.entry').FAMILY
    if family.name != folder:
        raise ValueError(f'name: the family of models/{folder}/ is named {family.name!r}')
    return family


FAMILIES: dict[str, Family] = {folder: _entry(folder) for folder in FAMILY_FOLDERS}


def _presets() -> dict:
    presets, owner = {}, {}
    for family in FAMILIES.values():
        for name, factory in family.presets.items():
            if name in presets:
                raise ValueError(f'preset {name!r}: named by both {owner[name]} and '
                                 f'{family.name}')
            presets[name], owner[name] = factory, family.name
    return presets


# Preset name -> its config's factory, every family's.
PRESETS = _presets()
_DEFAULTS = [f for f in FAMILIES.values() if f.is_default]
if len(_DEFAULTS) != 1:
    raise ValueError(f'is_default: exactly one family takes unclaimed folders, got '
                     f'{[f.name for f in _DEFAULTS]}')
DEFAULT_FAMILY = _DEFAULTS[0]


def family(name: str) -> Family:
    """The family of that name (ValueError naming the known ones)."""
    if name not in FAMILIES:
        raise ValueError(f'family: unknown {name!r}; the families are {sorted(FAMILIES)}')
    return FAMILIES[name]


def detect(raw: dict, source: str = 'config.json') -> Family:
    """The family of a checkpoint's config.json (module docstring; ``source``: the file, for
    errors)."""
    from .weights import CheckpointError
    claims = [f for f in FAMILIES.values() if not f.is_default and f.detects(raw)]
    if len(claims) > 1:
        raise CheckpointError(f'{source}: claimed by several families '
                              f'{[f.name for f in claims]}')
    if not claims:
        _refuse_unread_lerobot_type(raw, source)
    return claims[0] if claims else DEFAULT_FAMILY


def _refuse_unread_lerobot_type(raw: dict, source: str) -> None:
    """A LeRobot config.json names its policy in ``type`` (and has no Hugging Face
    ``model_type``). One that no family reads (pi0, smolvla, act, ...) would otherwise fall
    to the default family and fail on what that family looks for: it is refused by name."""
    from .weights import CheckpointError
    kind = raw.get('type') if isinstance(raw, dict) else None
    if not isinstance(kind, str) or 'model_type' in raw:
        return
    readable = [t for f in FAMILIES.values() for t in f.lerobot_types]
    raise CheckpointError(f'{source}: LeRobot policy type {kind!r} is not supported; the '
                          f'LeRobot types read here are {" / ".join(readable)}')


def family_of(raw: dict) -> str:
    """The name of ``detect(raw)``."""
    return detect(raw).name


def family_of_folder(folder) -> Family:
    """The family of a checkpoint folder, from its config.json (CheckpointError when the
    folder or the file is missing or not JSON)."""
    from .weights import CheckpointError, _read_json
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    return detect(_read_json(folder / 'config.json'), str(folder / 'config.json'))


def preset(name: str) -> Any:
    """The config of preset ``name``, of whichever family names it."""
    if name not in PRESETS:
        raise ValueError(f'unknown preset {name!r}; available presets: {sorted(PRESETS)}')
    return PRESETS[name]()


def family_of_preset(name: str) -> str:
    """The name of the family whose presets include ``name``."""
    return family_of_config(preset(name)).name


def family_of_config(cfg) -> Family:
    """The family whose config class ``cfg`` is (a model's config, a runner's ``cfg``)."""
    # The most derived class first: a family may extend another's config (ECoT's OpenVLA's).
    for family_ in sorted(FAMILIES.values(), key=lambda f: -len(f.config_class.__mro__)):
        if isinstance(cfg, family_.config_class):
            return family_
    raise ValueError(f'cfg: a {type(cfg).__name__} is no family\'s config; the families are '
                     f'{sorted(FAMILIES)}')


def load(folder, dtype=None, device='cpu', max_instruction_tokens: int = 128) -> LoadedModel:
    """The checkpoint in ``folder`` through its family's loader (``dtype``: a torch dtype,
    None = float32)."""
    if dtype is None:
        import torch
        dtype = torch.float32
    return family_of_folder(folder).load(Path(folder), dtype, device, max_instruction_tokens)


def checkpoint_options(preset_name: str) -> tuple[str, ...]:
    """The options ``make_checkpoint`` takes for ``preset_name`` beyond seed and dtype."""
    return family(family_of_preset(preset_name)).checkpoint_options


def make_checkpoint(preset_name: str, out, seed: int = 0, dtype: str = 'float32',
                    **options) -> Path:
    """A random-weight checkpoint of ``preset_name`` in its family's layout. ``options``: the
    family's own (``checkpoint_options``; OpenVLA: ``max_shard_bytes``; pi0-FAST:
    ``num_image_slots``, ``image_size``, ``state_dim``, ``decodable_chunks``); an option left
    None or False is not given, and one the family does not take is a ValueError naming it."""
    family_ = family(family_of_preset(preset_name))
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    for name in given:
        if name not in family_.checkpoint_options:
            takers = sorted(f.name for f in FAMILIES.values() if name in f.checkpoint_options)
            raise ValueError(f'{name}: {preset_name!r} is a {family_.name} preset, whose '
                             f'checkpoints take {list(family_.checkpoint_options)}; '
                             f'{name} is for {takers or "no family"}')
    return Path(family_.make_checkpoint(preset_name, out, seed=seed, dtype=dtype, **given))


__all__ = ['FAMILY_FOLDERS', 'FAMILIES', 'PRESETS', 'DEFAULT_FAMILY', 'Family', 'LoadedModel',
           'family', 'detect', 'family_of', 'family_of_folder', 'family_of_config',
           'family_of_preset', 'preset', 'load', 'make_checkpoint', 'checkpoint_options']
