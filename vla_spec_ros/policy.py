"""``VLAPolicy``: the public entry point (README, "Python API").

``VLAPolicy.from_pretrained(path_or_preset, **engine_options)`` loads a checkpoint folder of
any family the registry knows (models/registry.py: OpenVLA's Hugging Face layout, pi0-FAST's
LeRobot layout), or a preset name (a random-weight checkpoint of that preset is written once
to a cache folder and loaded through the same loader). ``VLAPolicy.from_config(path_or_preset,
config)`` is the same with an ``EngineConfig`` already built (the node builds its own from its
parameters): the engine runs with that very object. ``predict`` runs one frame to completion;
``engine`` is the streaming interface over the same model.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .config import EngineConfig
from .devices import parse_device
from .engine.engine import Engine
from .engine.result import ActionResult, Frame
from .engine.device.runner import TORCH_DTYPES, ModelRunner
from .models import registry
from .models.registry import PRESETS
from .models.weights import CheckpointError, _read_json

PREDICT_STREAM = '__predict__'
STATS_FILE = 'dataset_statistics.json'


def cache_dir() -> Path:
    return Path(os.environ.get('VLA_SPEC_CACHE', Path.home() / '.cache' / 'vla_spec_ros'))


def _names_a_path(text: str) -> bool:
    """A path written as one (a separator, ``~``, ``.`` or ``..``), not a bare name."""
    return (any(sep and sep in text for sep in (os.sep, os.altsep))
            or text.startswith('~') or text in (os.curdir, os.pardir))


def resolve_checkpoint(path_or_preset: str) -> Path:
    """A folder path, or an embedded model's or a preset's name -> a checkpoint folder
    (presets are made on first use). A path written as one (``./metaworld-demo``,
    ``/data/ckpt``) is that folder, config.json or not (loading names what it lacks). A bare
    name is a folder of the working directory only when that folder holds a config.json, so
    that a stray folder named like an embedded model or preset does not hide it."""
    path = Path(path_or_preset).expanduser()
    if path.is_dir() and (_names_a_path(path_or_preset) or (path / 'config.json').is_file()):
        return path
    from . import assets
    embedded = assets.embedded_checkpoint(path_or_preset)
    if embedded is not None:
        return embedded
    if path_or_preset in PRESETS:
        folder = cache_dir() / 'presets' / f'{path_or_preset}-seed0'
        if not (folder / 'config.json').is_file():
            # Written aside, then renamed: a concurrent first use never sees half a checkpoint.
            tmp = folder.with_name(folder.name + f'.tmp{os.getpid()}')
            registry.make_checkpoint(path_or_preset, tmp, seed=0)
            if folder.exists():
                shutil.rmtree(tmp)      # another process finished first; same seed, same files
            else:
                tmp.replace(folder)
        return folder
    # An embedded model may share its name with a preset (metaworld-demo): listed once.
    stray = (f'; the folder {path.resolve()} has no config.json, so it is no checkpoint'
             if path.is_dir() else '')
    raise CheckpointError(f'{path_or_preset!r} is neither a checkpoint folder nor a preset '
                          f'({sorted(set(PRESETS) | set(assets.embedded_names()))}){stray}')


def _norm_stats(folder: Path, loaded) -> tuple[dict, str]:
    """(the dataset statistics, the file they come from): the family's own (pi0-FAST:
    LeRobot's processor files), else config.json's ``norm_stats``, else
    dataset_statistics.json, which must be a JSON object (CheckpointError naming it). The
    engine checks the entries themselves (``actions.stats_by_key``)."""
    if loaded.norm_stats:
        return loaded.norm_stats, str(folder)
    if loaded.raw.get('norm_stats'):
        return loaded.raw['norm_stats'], str(folder / 'config.json')
    stats_file = folder / STATS_FILE
    if not stats_file.is_file():
        raise CheckpointError(f'{folder}: no norm_stats in config.json and no {STATS_FILE}')
    norm_stats = _read_json(stats_file)
    if not isinstance(norm_stats, dict) or not norm_stats:
        raise CheckpointError(f'{stats_file}: expected a JSON object of datasets '
                              f'({{"<unnorm_key>": {{"action": ...}}}}), got '
                              f'{_read_as(norm_stats)}')
    return norm_stats, str(stats_file)


def _read_as(value) -> str:
    return 'an empty object' if value == {} else f'a {type(value).__name__}'


class VLAPolicy:
    def __init__(self, engine: Engine, source: str):
        self.engine = engine
        self.source = source

    @classmethod
    def from_pretrained(cls, path_or_preset: str, **engine_options) -> 'VLAPolicy':
        """A policy over ``path_or_preset``: a checkpoint folder, an embedded model
        (``metaworld-demo``, ``metaworld-demo-fast``) or a preset (a random-weight checkpoint
        made on first use); a bare name is a folder only when it holds a config.json
        (``resolve_checkpoint``). ``engine_options`` are ``EngineConfig``'s fields (ValueError
        naming an unknown or bad one).

        ``draft_path`` (the spec modes' drafter): None or ``''`` (the node's empty parameter)
        = the model's default draft (the family's ``default_draft``: the previous action for
        OpenVLA, ``previous_action+shifted_chunk`` for pi0-FAST); ``'previous_action'``,
        ``'shifted_chunk'``, ``'shifted_chunk_linear'`` or several joined by ``+`` (drafts
        without a draft model); an EAGLE draft-head folder; ``'checkpoint'`` (the
        checkpoint's ``draft/`` folder); ``'random'`` (a seeded random head, for tests)."""
        if engine_options.get('draft_path') == '':
            # '' is how a ROS string parameter says "unset" (ros/params.py); the API takes it
            # the same way rather than reading the working directory as a draft folder.
            engine_options = {**engine_options, 'draft_path': None}
        return cls.from_config(path_or_preset, EngineConfig.from_dict(engine_options))

    @classmethod
    def from_config(cls, path_or_preset: str, config: EngineConfig) -> 'VLAPolicy':
        """A policy over ``path_or_preset`` (as ``from_pretrained``) whose engine runs with
        ``config`` itself (``policy.config is config``)."""
        if not isinstance(config, EngineConfig):
            raise TypeError(f'config: expected an EngineConfig, got {type(config).__name__}')
        parse_device('device', config.device)     # CUDA present, and device N on this machine
        folder = resolve_checkpoint(path_or_preset)
        loaded = registry.load(folder, TORCH_DTYPES[config.dtype], config.device,
                               config.max_instruction_tokens)
        norm_stats, stats_source = _norm_stats(folder, loaded)
        codec = loaded.codec
        if config.max_reasoning_tokens:
            codec = codec.with_reasoning_budget(config.max_reasoning_tokens)
        runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config,
                             codec=codec, checkpoint_folder=folder)
        return cls(Engine(runner, norm_stats, config, stats_source=stats_source), str(folder))

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def unnorm_keys(self) -> tuple[str, ...]:
        return tuple(sorted(self.engine.norm_stats))

    @property
    def model_config(self):
        return self.engine.runner.cfg

    def predict(self, image, instruction: str, unnorm_key: str | None = None,
                state=None) -> ActionResult:
        """One frame -> its action (blocking). Bad input raises ValueError. ``image``: one
        (H, W, 3) uint8 array, or a tuple of them (one per image slot of a multi-camera
        model); ``state``: the robot's raw state (joint order, the checkpoint's units), for a
        family that reads one: the family normalises it (pi0-FAST: with the checkpoint's
        state statistics; a checkpoint without them takes it as already normalised). None:
        the family's default (pi0-FAST: the normalised zero state).

        The engine must be idle: ``predict`` steps it until its own frame is done, so it would
        otherwise also step (and swallow the results of) the frames a node or another caller
        submitted through the streaming interface. A busy engine raises RuntimeError naming
        the streams that hold frames (a node stopped with ``destroy_node`` releases its
        own)."""
        if self.engine.has_work():
            raise RuntimeError(
                f'predict() needs an idle engine; streams {list(self.engine.busy_streams)} have '
                'frames waiting or in flight (a node serving this policy, or frames submitted '
                'through policy.engine): destroy that node, or call policy.engine.reset()')
        request_id = self.engine.submit(Frame(image, instruction, unnorm_key, PREDICT_STREAM,
                                              state=state))
        for finished in self.engine.run_until_idle():
            if finished.request_id == request_id:
                if finished.error is not None:
                    raise RuntimeError(f'inference failed: {finished.error}')
                return finished.result
        raise RuntimeError('engine finished without producing the requested action')
