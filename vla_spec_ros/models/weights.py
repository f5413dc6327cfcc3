"""Safetensors checkpoint I/O shared by the model families (S8): only safetensors are read,
no code shipped with a checkpoint is executed, and a missing, truncated or mismatched file is a
``CheckpointError`` naming the file and key."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors import safe_open


class CheckpointError(ValueError):
    """A checkpoint folder is missing, truncated or does not match the model."""


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f'missing file {path}')
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f'{path}: not valid JSON ({exc})') from exc


# ---- safetensors ----------------------------------------------------------------------------

def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_header_entry(path: Path, key: str, entry) -> None:
    """A tensor's header entry: a dtype name, a shape of counts and ``data_offsets`` [begin,
    end] with begin <= end (what the truncation check and the shape checks read)."""
    entry = entry if isinstance(entry, dict) else {}
    offsets, shape = entry.get('data_offsets'), entry.get('shape')
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1]):
        raise CheckpointError(f'{path}: corrupt safetensors header: tensor {key} has no valid '
                              f'data_offsets (got {offsets!r})')
    if not (isinstance(shape, list) and all(map(_is_count, shape))
            and isinstance(entry.get('dtype'), str)):
        raise CheckpointError(f'{path}: corrupt safetensors header: tensor {key} has no valid '
                              f'shape and dtype (got {shape!r}, {entry.get("dtype")!r})')


def _check_safetensors_file(path: Path) -> dict:
    """Parse the header and verify the file holds every byte it declares (truncation check)."""
    if not path.is_file():
        raise CheckpointError(f'missing weight file {path}')
    size = path.stat().st_size
    with open(path, 'rb') as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f'{path}: truncated (no safetensors header)')
        (header_len,) = struct.unpack('<Q', head)
        if header_len > size - 8:
            raise CheckpointError(f'{path}: truncated (header of {header_len} bytes, '
                                  f'file has {size})')
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f'{path}: corrupt safetensors header ({exc})') from exc
    if not isinstance(header, dict):
        raise CheckpointError(f'{path}: corrupt safetensors header (a JSON '
                              f'{type(header).__name__}, not an object of tensors)')
    header.pop('__metadata__', None)
    for key, entry in header.items():
        _check_header_entry(path, key, entry)
    data_end = max((v['data_offsets'][1] for v in header.values()), default=0)
    if 8 + header_len + data_end > size:
        raise CheckpointError(f'{path}: truncated: tensors need {8 + header_len + data_end} '
                              f'bytes, file has {size}')
    return header


def weight_files(folder: Path) -> dict[str, Path]:
    """key -> file, from the shard index if present, else from model.safetensors."""
    index = folder / 'model.safetensors.index.json'
    single = folder / 'model.safetensors'
    if index.is_file():
        weight_map = _read_json(index).get('weight_map')
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f'{index}: no weight_map')
        mapping = {k: folder / v for k, v in weight_map.items()}
        for path in sorted(set(mapping.values())):
            header = _check_safetensors_file(path)
            listed = {k for k, p in mapping.items() if p == path}
            absent = sorted(listed - set(header))
            if absent:
                raise CheckpointError(f'{path}: missing key {absent[0]} listed in {index.name}'
                                      f' ({len(absent)} missing)')
        return mapping
    if single.is_file():
        return {k: single for k in _check_safetensors_file(single)}
    if any(folder.glob('*.bin')) or any(folder.glob('*.pt')):
        raise CheckpointError(f'{folder}: only pickle weights (.bin/.pt) found; only '
                              'safetensors are loaded (no code from checkpoints is executed)')
    raise CheckpointError(f'{folder}: no model.safetensors or model.safetensors.index.json')


def load_state_dict(folder: Path, expected: dict[str, tuple], allowed_unused: set[str],
                    dtype: torch.dtype, device, mapping: dict[str, Path] | None = None
                    ) -> dict[str, torch.Tensor]:
    """The ``expected`` tensors (key -> shape) of the checkpoint in ``folder`` (``mapping``:
    its ``weight_files``, when already read)."""
    if mapping is None:
        mapping = weight_files(folder)
    missing = sorted(set(expected) - set(mapping))
    if missing:
        raise CheckpointError(f'{folder}: missing key {missing[0]} ({len(missing)} missing)')
    unexpected = sorted(set(mapping) - set(expected) - allowed_unused)
    if unexpected:
        raise CheckpointError(f'{mapping[unexpected[0]]}: unexpected key {unexpected[0]} '
                              f'({len(unexpected)} unexpected)')
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for key in expected:
        by_file.setdefault(mapping[key], []).append(key)
    for path, keys in by_file.items():
        with safe_open(str(path), framework='pt', device='cpu') as f:
            for key in keys:
                shape = tuple(f.get_slice(key).get_shape())
                if shape != tuple(expected[key]):
                    raise CheckpointError(f'{path}: key {key} has shape {shape}, model expects '
                                          f'{tuple(expected[key])}')
                tensor = f.get_tensor(key).to(device=device)
                _check_finite(path, key, tensor)
                state[key] = tensor.to(dtype=dtype)
    return state


def _check_finite(path: Path, key: str, tensor: torch.Tensor) -> None:
    """CheckpointError naming the file and key when a floating tensor holds NaN or inf as
    stored (before any cast: a value a narrower dtype cannot hold is not the file's fault).
    A model with one such weight answers NaN logits, so its greedy tokens and actions are
    meaningless; found here, it is one line instead of garbage at run time."""
    if not tensor.is_floating_point():
        return
    values = tensor.to(torch.float16) if tensor.element_size() == 1 else tensor  # float8
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int(finite.numel() - finite.sum())
        raise CheckpointError(f'{path}: key {key} holds {bad} non-finite value'
                              f'{"s" if bad > 1 else ""} (NaN or inf) of {finite.numel()}')
