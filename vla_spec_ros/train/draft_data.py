"""Draft-head training data: the verifier's own greedy outputs on the user's observations.

Follows Spec-VLA's data generation (docs/speculation.md, Training data and losses) with its two
quirks fixed: the verifier runs on the INFERENCE prompt (no ground-truth action tokens in it) and
every generated position is visible to later ones (no masked action keys). Per observation the AR
reference is run greedily (prefill, then ``action_dim - 1`` single-token decodes, as engine/ar.py)
and stored:

    prefix_embeds (L, H)            e_0..e_{L-1}: BOS + image patches + text embeddings
    features      (L + A - 1, H)    f_0..f_{L+A-2}: final-normed verifier outputs; f_p for
                                    p >= L is the output when consuming a_{p-L+1}
    tokens        (A,)              a_1..a_A, the greedy action tokens

Input observations (``load_observations``):
- a ``.npz`` file with ``images`` (N, H, W, 3) uint8 RGB and ``instructions`` (N,) str (or one
  str for all images); a folder of such ``.npz`` files is read in name order;
- a folder of ``*.png`` / ``*.jpg`` / ``*.jpeg`` images with ``instructions.jsonl`` (one
  ``{"image": "<file name>", "instruction": "<text>"}`` per line: exactly these pairs) or
  ``instructions.txt`` (one instruction used for every image in the folder, name order).
A ROS 2 bag gives the same ``ObservationSet`` through ``bag_frames.load_bag_observations``.

Stored data (``<data_dir>``): ``shard-r<rank>-<n>.safetensors`` with the per-sample tensors
concatenated along rows (``prefix_embeds``, ``features``, ``tokens``, ``prefix_lens``) and a
``manifest.json`` written last (its presence marks complete data).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..engine.ar import run_ar
from ..engine.result import Frame
from ..models.attention import StepBatch

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg')
DATA_FORMAT = 'vla-spec-draft-data'
DATA_VERSION = 1
MANIFEST = 'manifest.json'


# ---- observations ---------------------------------------------------------------------------

def _read_image(path: Path) -> np.ndarray:
    import cv2
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f'{path}: cannot read image')
    return np.ascontiguousarray(bgr[:, :, ::-1])            # (H, W, 3) uint8 RGB


def _npz_arrays(path: Path) -> tuple[np.ndarray, list[str]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if 'images' not in data or 'instructions' not in data:
                raise ValueError(f'{path}: needs arrays "images" and "instructions", has '
                                 f'{sorted(data.files)}')
            images, instructions = data['images'], data['instructions']
    except ValueError as exc:
        if 'allow_pickle' in str(exc) or 'Object arrays' in str(exc):
            raise ValueError(f'{path}: object arrays need pickle, which is refused; store '
                             'instructions as a numpy str array') from exc
        raise
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f'{path}: images must be (N, H, W, 3) uint8, got {images.shape} '
                         f'{images.dtype}')
    if instructions.dtype.kind not in 'US':
        raise ValueError(f'{path}: instructions must be strings, got dtype {instructions.dtype}')
    texts = [str(x) for x in np.atleast_1d(instructions).tolist()]
    if len(texts) == 1 and images.shape[0] != 1:
        texts = texts * images.shape[0]
    if len(texts) != images.shape[0]:
        raise ValueError(f'{path}: {images.shape[0]} images but {len(texts)} instructions')
    return images, texts


class ObservationSet:
    """A sequence of (image (H, W, 3) uint8 RGB, instruction) pairs; images load lazily."""

    def __init__(self, items: list, source: str):
        self._items = items         # (image array or image path, instruction)
        self.source = source

    def __len__(self) -> int:
        return len(self._items)

    def limit(self, max_samples: int) -> 'ObservationSet':
        """The first ``max_samples`` observations."""
        return ObservationSet(self._items[:max_samples], self.source)

    def __getitem__(self, index: int) -> tuple[np.ndarray, str]:
        image, instruction = self._items[index]
        if isinstance(image, Path):
            image = _read_image(image)
        return image, instruction


def load_observations(path: str | os.PathLike) -> ObservationSet:
    """Observations from a ``.npz`` file or a folder (layouts in the module docstring)."""
    path = Path(path).expanduser()
    items: list = []
    if path.is_file():
        if path.suffix != '.npz':
            raise ValueError(f'{path}: expected a .npz file or a folder')
        images, texts = _npz_arrays(path)
        items = list(zip(images, texts))
    elif path.is_dir():
        npz_files = sorted(path.glob('*.npz'))
        jsonl, txt = path / 'instructions.jsonl', path / 'instructions.txt'
        if npz_files:
            for f in npz_files:
                images, texts = _npz_arrays(f)
                items.extend(zip(images, texts))
        elif jsonl.is_file():
            for n, line in enumerate(jsonl.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    image, instruction = path / entry['image'], str(entry['instruction'])
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ValueError(f'{jsonl}:{n}: expected {{"image": ..., "instruction": '
                                     f'...}} ({exc!r})') from exc
                if not image.is_file():
                    raise ValueError(f'{jsonl}:{n}: image {image} does not exist')
                items.append((image, instruction))
        elif txt.is_file():
            instruction = txt.read_text().strip()
            if not instruction or '\n' in instruction:
                raise ValueError(f'{txt}: must hold exactly one instruction line (use '
                                 'instructions.jsonl for one instruction per image)')
            images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            items = [(p, instruction) for p in images]
        else:
            raise ValueError(f'{path}: no *.npz, instructions.jsonl or instructions.txt')
    else:
        raise ValueError(f'observations path {path} does not exist')
    if not items:
        raise ValueError(f'{path}: no observations found')
    return ObservationSet(items, str(path))


# ---- generation -----------------------------------------------------------------------------

@dataclass
class DraftSample:
    prefix_embeds: torch.Tensor     # (L, H)
    features: torch.Tensor          # (L + A - 1, H)
    tokens: torch.Tensor            # (A,) int64

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_embeds.shape[0])


@torch.no_grad()
def verifier_sample(runner, engine_config, image: np.ndarray, instruction: str) -> DraftSample:
    """Run the AR reference on one observation, keeping its inputs and features."""
    prompt = runner.prepare_prompt(Frame(image, instruction), engine_config)
    tokens, features = run_ar(runner, prompt.embeds, runner.max_action_tokens,
                              engine_config.restrict_to_action_tokens)
    return DraftSample(prompt.embeds, features, torch.tensor(tokens))


def _store_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision verifiers store as they run; float32/64 store float32 (training dtype)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def _write_shard(path: Path, samples: list[DraftSample], dtype: torch.dtype) -> None:
    tensors = {
        'prefix_embeds': torch.cat([s.prefix_embeds for s in samples]).to('cpu', dtype),
        'features': torch.cat([s.features for s in samples]).to('cpu', dtype),
        'tokens': torch.stack([s.tokens for s in samples]).to('cpu', torch.int64),
        'prefix_lens': torch.tensor([s.prefix_len for s in samples], dtype=torch.int64),
    }
    tmp = path.with_name(path.name + '.tmp')
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    tmp.replace(path)


def generate_shards(runner, engine_config, observations: Sequence, data_dir: str | Path, *,
                    rank: int = 0, world_size: int = 1, samples_per_shard: int = 256,
                    progress: bool = True) -> list[Path]:
    """This rank's share (observations rank, rank + world_size, ...) -> shard files."""
    from tqdm import tqdm
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    for stale in data_dir.glob(f'shard-r{rank:03d}-*'):
        stale.unlink()
    dtype = _store_dtype(runner.dtype)
    indices = range(rank, len(observations), world_size)
    shards, pending = [], []
    for index in tqdm(indices, desc='draft data', disable=not progress):
        image, instruction = observations[index]
        try:
            pending.append(verifier_sample(runner, engine_config, image, instruction))
        except ValueError as exc:
            raise ValueError(f'observation {index} of {getattr(observations, "source", "")}: '
                             f'{exc}') from exc
        if len(pending) == samples_per_shard:
            shards.append(data_dir / f'shard-r{rank:03d}-{len(shards):05d}.safetensors')
            _write_shard(shards[-1], pending, dtype)
            pending = []
    if pending:
        shards.append(data_dir / f'shard-r{rank:03d}-{len(shards):05d}.safetensors')
        _write_shard(shards[-1], pending, dtype)
    return shards


def write_manifest(data_dir: str | Path, settings: dict) -> dict:
    """Index every shard in ``data_dir`` (written last: its presence marks complete data)."""
    data_dir = Path(data_dir)
    shards = []
    for path in sorted(data_dir.glob('shard-*.safetensors')):
        with safe_open(str(path), framework='pt') as f:
            num = f.get_slice('prefix_lens').get_shape()[0]
        shards.append({'file': path.name, 'num_samples': int(num)})
    manifest = {'format': DATA_FORMAT, 'version': DATA_VERSION, 'settings': settings,
                'num_samples': sum(s['num_samples'] for s in shards), 'shards': shards}
    (data_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def read_manifest(data_dir: str | Path) -> dict | None:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if manifest.get('format') != DATA_FORMAT or manifest.get('version') != DATA_VERSION:
        return None
    return manifest


class DraftDataset:
    """Random access to stored samples; tensors are read from the shards on demand."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        manifest = read_manifest(self.data_dir)
        if manifest is None:
            raise ValueError(f'{self.data_dir}: no complete draft data ({MANIFEST} missing)')
        self.index: list[tuple[Path, int, int, int]] = []   # file, sample, row0, feature row0
        for shard in manifest['shards']:
            path = self.data_dir / shard['file']
            with safe_open(str(path), framework='pt') as f:
                lens = f.get_tensor('prefix_lens').tolist()
                num_tokens = f.get_slice('tokens').get_shape()[1]
            row = feature_row = 0
            for i, length in enumerate(lens):
                self.index.append((path, i, row, feature_row))
                row += length
                feature_row += length + num_tokens - 1
        self.action_dim = int(num_tokens) if self.index else 0
        self._handles: dict[Path, object] = {}

    def __len__(self) -> int:
        return len(self.index)

    def _handle(self, path: Path):
        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework='pt')
        return self._handles[path]

    def __getitem__(self, i: int) -> DraftSample:
        path, sample, row, feature_row = self.index[i]
        f = self._handle(path)
        length = int(f.get_slice('prefix_lens')[sample:sample + 1][0])
        num_features = length + self.action_dim - 1
        return DraftSample(f.get_slice('prefix_embeds')[row:row + length],
                           f.get_slice('features')[feature_row:feature_row + num_features],
                           f.get_slice('tokens')[sample:sample + 1][0])


# ---- packing for the draft head ---------------------------------------------------------------

@dataclass
class PackedDraftBatch:
    """Several samples packed into one draft forward (block-diagonal causal attention).

    Per sample of prefix length L: draft positions 0..L+A-3 with inputs e_{p+1} and f_p (the
    prefix as context, then the action tokens a_1..a_{A-1} paired with the features before
    them). Loss rows are positions L-1..L+A-3: their targets are f_L..f_{L+A-2}, i.e. the
    draft predicts a_2..a_A, exactly what the verifier asks of it (a_1 comes from the prefill).
    """

    inputs_embeds: torch.Tensor     # (T, H)
    features: torch.Tensor          # (T, H)
    batch: StepBatch
    loss_rows: torch.Tensor         # (R,) rows of the packed output that carry loss
    targets: torch.Tensor           # (R, H) verifier features the draft must predict
    target_tokens: torch.Tensor     # (R,) verifier greedy tokens a_2..a_A


def pack_samples(samples: Sequence[DraftSample], embed, device, dtype) -> PackedDraftBatch:
    """``embed``: (n,) ids -> (n, H) verifier token embeddings."""
    inputs, feats, rows, targets, target_tokens, lengths = [], [], [], [], [], []
    offset = 0
    for s in samples:
        length, num_tokens = s.prefix_len, int(s.tokens.shape[0])
        count = length + num_tokens - 2
        tokens = s.tokens.to(device)
        action_embeds = embed(tokens[:num_tokens - 1]).to(dtype)
        inputs.append(torch.cat([s.prefix_embeds[1:].to(device, dtype), action_embeds]))
        feats.append(s.features[:count].to(device, dtype))
        rows.append(torch.arange(offset + length - 1, offset + count, device=device))
        targets.append(s.features[length:length + num_tokens - 1].to(device, dtype))
        target_tokens.append(tokens[1:])
        lengths.append(count)
        offset += count
    lens = torch.tensor(lengths, device=device)
    segment = torch.repeat_interleave(torch.arange(len(samples), device=device), lens)
    starts = torch.cumsum(lens, 0) - lens
    slots = torch.arange(offset, device=device)
    positions = slots - starts[segment]
    mask = (segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None])
    batch = StepBatch(positions=positions, slot_mapping=slots, attn_mask=mask, kv_limit=offset)
    return PackedDraftBatch(torch.cat(inputs), torch.cat(feats), batch, torch.cat(rows),
                            torch.cat(targets), torch.cat(target_tokens))
