"""Dataset statistics of a pi0-FAST checkpoint in LeRobot's layout (docs/pi0fast.md, Statistics).

LeRobot 0.6 keeps them only in its processor files beside ``config.json``:

- ``policy_preprocessor.json``: the input pipeline; its ``normalizer_processor`` step names
  ``policy_preprocessor_step_3_normalizer_processor.safetensors`` (``state_file``) and the
  normalisation mode per feature type (``norm_map``: ``STATE``, ``ACTION``), with ``eps``;
- ``policy_postprocessor.json``: the output pipeline; its ``unnormalizer_processor`` step names
  ``policy_postprocessor_step_0_unnormalizer_processor.safetensors``.

Both safetensors files hold float32 ``action.{mean,std,min,max,q01,q99}`` and
``observation.state.{...}``. The state is normalised with the preprocessor's file and mode,
the action un-normalised with the postprocessor's. Without the JSON files the safetensors files
are found by those names and the modes come from config.json's ``normalization_mapping``
(LeRobot's default: ``MEAN_STD`` for both).

LeRobot's formulas (``processor/normalize_processor.py``), computed here in float32 as there:

- ``MEAN_STD``: ``(x - mean) / (std + eps)``; inverse ``x * std + mean``;
- ``MIN_MAX`` / ``QUANTILES`` / ``QUANTILE10``: ``2 (x - lo) / (hi - lo) - 1`` over (min, max) /
  (q01, q99) / (q10, q90), a zero span replaced by ``eps``; inverse ``(x + 1) / 2 (hi - lo) +
  lo``;
- ``IDENTITY``, or a feature without statistics: unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ..weights import CheckpointError, _read_json

PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'
NORMALIZER_STEP = 'normalizer_processor'
UNNORMALIZER_STEP = 'unnormalizer_processor'
NORMALIZER_FILE = 'policy_preprocessor_step_3_normalizer_processor.safetensors'
UNNORMALIZER_FILE = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors'
STATE_KEY = 'observation.state'
ACTION_KEY = 'action'
MODES = ('IDENTITY', 'MEAN_STD', 'MIN_MAX', 'QUANTILES', 'QUANTILE10')
RANGE_KEYS = {'MIN_MAX': ('min', 'max'), 'QUANTILES': ('q01', 'q99'),
              'QUANTILE10': ('q10', 'q90')}
DEFAULT_MAPPING = {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}
EPS = 1e-8
UNNORM_KEY = 'default'      # the engine's norm_stats key: LeRobot keeps one dataset


def _required(mode: str) -> tuple[str, ...]:
    return ('mean', 'std') if mode == 'MEAN_STD' else RANGE_KEYS.get(mode, ())


def _check_mode(mode, source: str) -> str:
    if mode not in MODES:
        raise CheckpointError(f'{source}: normalisation mode {mode!r} is not one of {MODES}')
    return mode


@dataclass(frozen=True)
class StateNormalizer:
    """LeRobot's forward normalisation of the robot state, in float32 (module docstring)."""

    mode: str
    stats: dict             # name -> (state_dim,) float32
    eps: float = EPS

    @property
    def state_dim(self) -> int:
        return int(next(iter(self.stats.values())).shape[0])

    def __call__(self, state) -> np.ndarray:
        x = np.asarray(state, dtype=np.float32).reshape(-1)
        if x.shape[0] != self.state_dim:
            raise ValueError(f'state: {x.shape[0]} dimensions; the statistics have '
                             f'{self.state_dim}')
        eps = np.float32(self.eps)
        if self.mode == 'MEAN_STD':
            return (x - self.stats['mean']) / (self.stats['std'] + eps)
        if self.mode in RANGE_KEYS:
            lo, hi = (self.stats[k] for k in RANGE_KEYS[self.mode])
            span = hi - lo
            span = np.where(span == 0, eps, span).astype(np.float32)
            return np.float32(2) * (x - lo) / span - np.float32(1)
        return x


@dataclass(frozen=True)
class CheckpointStatistics:
    """A checkpoint's action and state statistics with their modes."""

    action: dict            # name -> (action_dim,) float32
    state: dict             # name -> (state_dim,) float32; empty: none
    action_mode: str = 'MEAN_STD'
    state_mode: str = 'MEAN_STD'
    eps: float = EPS

    def norm_stats(self) -> dict:
        """The engine's ``norm_stats`` (``actions.ActionStats.from_norm_stats``): one key."""
        entry = {k: np.asarray(v, dtype=np.float64).tolist() for k, v in self.action.items()}
        dim = len(next(iter(entry.values())))
        entry.update(mode=self.action_mode, mask=[True] * dim)
        return {UNNORM_KEY: {'action': entry}}

    def state_normalizer(self) -> StateNormalizer | None:
        """None when the state passes unchanged (``IDENTITY``, or no state statistics)."""
        if self.state_mode == 'IDENTITY' or not self.state:
            return None
        return StateNormalizer(self.state_mode, dict(self.state), self.eps)


# ---- reading --------------------------------------------------------------------------------

def _step(folder: Path, file: str, registry_name: str) -> dict | None:
    path = folder / file
    if not path.is_file():
        return None
    steps = _read_json(path).get('steps')
    for step in steps if isinstance(steps, list) else []:
        if isinstance(step, dict) and step.get('registry_name') == registry_name:
            return step
    raise CheckpointError(f'{path}: no {registry_name!r} step')


def _stats_file(folder: Path, step: dict | None, pattern: str) -> Path | None:
    if step is not None and step.get('state_file'):
        path = folder / step['state_file']
        if not path.is_file():
            raise CheckpointError(f'missing statistics file {path}')
        return path
    found = sorted(folder.glob(pattern))
    if len(found) > 1:
        raise CheckpointError(f'{folder}: several statistics files {[p.name for p in found]}')
    return found[0] if found else None


def _features(path: Path, key: str, mode: str, dim: int) -> dict:
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f'{path}: cannot read ({exc})') from exc
    prefix = key + '.'
    out = {k[len(prefix):]: np.asarray(v, dtype=np.float32).reshape(-1)
           for k, v in tensors.items() if k.startswith(prefix)}
    missing = [name for name in _required(mode) if name not in out]
    if missing:
        raise CheckpointError(f'{path}: {mode} needs {key}.{missing[0]}')
    wrong = {name: v.shape[0] for name, v in out.items() if v.shape[0] != dim}
    if wrong:
        raise CheckpointError(f'{path}: {key} statistics of {wrong} values; the feature has '
                              f'{dim}')
    return out


def read_statistics(folder, raw: dict, state_dim: int,
                    action_dim: int) -> CheckpointStatistics | None:
    """LeRobot's processor statistics of ``folder`` (module docstring), or None when it has
    none."""
    folder = Path(folder)
    pre = _step(folder, PREPROCESSOR_FILE, NORMALIZER_STEP)
    post = _step(folder, POSTPROCESSOR_FILE, UNNORMALIZER_STEP)
    pre_file = _stats_file(folder, pre, 'policy_preprocessor_step_*_normalizer_processor'
                                        '.safetensors')
    post_file = _stats_file(folder, post, 'policy_postprocessor_step_*_unnormalizer_processor'
                                          '.safetensors')
    if pre_file is None and post_file is None:
        return None
    mapping = dict(DEFAULT_MAPPING)
    mapping.update(raw.get('normalization_mapping') or {})
    modes = {}
    for kind, step, source in (('STATE', pre, PREPROCESSOR_FILE),
                               ('ACTION', post, POSTPROCESSOR_FILE)):
        norm_map = ((step or {}).get('config') or {}).get('norm_map') or mapping
        modes[kind] = _check_mode(norm_map.get(kind, 'IDENTITY'), str(folder / source))
    eps = float(((pre or post or {}).get('config') or {}).get('eps', EPS))
    action = _features(post_file or pre_file, ACTION_KEY, modes['ACTION'], action_dim)
    state = _features(pre_file or post_file, STATE_KEY, modes['STATE'], state_dim)
    if modes['ACTION'] != 'IDENTITY' and not action:
        raise CheckpointError(f'{post_file or pre_file}: no action statistics')
    return CheckpointStatistics(action, state, modes['ACTION'], modes['STATE'], eps)


# ---- writing --------------------------------------------------------------------------------

def _tensors(stats: CheckpointStatistics) -> dict:
    out = {f'{ACTION_KEY}.{k}': np.ascontiguousarray(v, dtype=np.float32)
           for k, v in stats.action.items()}
    out.update({f'{STATE_KEY}.{k}': np.ascontiguousarray(v, dtype=np.float32)
                for k, v in stats.state.items()})
    return out


def write_statistics(folder, stats: CheckpointStatistics, raw: dict) -> None:
    """The two processor JSON files and their statistics, as LeRobot 0.6.1's
    ``make_pre_post_processors(...)`` + ``save_pretrained`` write them for ``raw`` (the
    checkpoint's config.json). ``action_tokenizer_processor`` also names
    ``paligemma_tokenizer_name`` and ``fast_skip_tokens`` (LeRobot's own save leaves them to
    their hub defaults)."""
    folder = Path(folder)
    tensors = _tensors(stats)
    save_file(tensors, str(folder / NORMALIZER_FILE))
    save_file(tensors, str(folder / UNNORMALIZER_FILE))
    norm_map = {'VISUAL': 'IDENTITY', 'STATE': stats.state_mode, 'ACTION': stats.action_mode}
    inputs = dict(raw.get('input_features') or {})
    outputs = dict(raw.get('output_features') or {})
    pre = {'name': 'policy_preprocessor', 'steps': [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
        {'registry_name': 'relative_actions_processor',
         'config': {'enabled': False, 'exclude_joints': ['gripper'], 'action_names': None}},
        {'registry_name': NORMALIZER_STEP,
         'config': {'eps': stats.eps, 'features': {**inputs, **outputs}, 'norm_map': norm_map},
         'state_file': NORMALIZER_FILE},
        {'registry_name': 'pi0_fast_prepare_state_tokenizer_processor_step', 'config': {}},
        {'registry_name': 'tokenizer_processor',
         'config': {'max_length': raw.get('tokenizer_max_length', 200), 'task_key': 'task',
                    'padding_side': 'right', 'padding': 'max_length', 'truncation': True,
                    'tokenizer_name': raw['text_tokenizer_name']}},
        {'registry_name': 'action_tokenizer_processor',
         'config': {'trust_remote_code': True,
                    'max_action_tokens': raw.get('max_action_tokens', 256),
                    'action_tokenizer_name': raw['action_tokenizer_name'],
                    'fast_skip_tokens': raw.get('fast_skip_tokens', 128),
                    'paligemma_tokenizer_name': raw['text_tokenizer_name']}},
        {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}},
    ]}
    post = {'name': 'policy_postprocessor', 'steps': [
        {'registry_name': UNNORMALIZER_STEP,
         'config': {'eps': stats.eps, 'features': outputs, 'norm_map': norm_map},
         'state_file': UNNORMALIZER_FILE},
        {'registry_name': 'absolute_actions_processor', 'config': {'enabled': False}},
        {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}},
    ]}
    (folder / PREPROCESSOR_FILE).write_text(json.dumps(pre, indent=2))
    (folder / POSTPROCESSOR_FILE).write_text(json.dumps(post, indent=2))


def synthetic_statistics(action_dim: int, state_dim: int, seed: int = 0,
                         mode: str = 'MEAN_STD') -> CheckpointStatistics:
    """Statistics of a random-weight checkpoint: every name LeRobot writes, a state whose
    mean and spread are not 0 and 1 (so that normalising it matters)."""
    rng = np.random.default_rng(seed)

    def feature(dim: int) -> dict:
        q99, q01 = rng.uniform(0.5, 1.0, dim), -rng.uniform(0.5, 1.0, dim)
        return {'mean': (q01 + q99) / 2, 'std': (q99 - q01) / 4, 'min': q01 * 1.5,
                'max': q99 * 1.5, 'q01': q01, 'q99': q99}

    action, state = feature(action_dim), feature(state_dim)
    return CheckpointStatistics(
        {k: v.astype(np.float32) for k, v in action.items()},
        {k: v.astype(np.float32) for k, v in state.items()}, mode, mode)
