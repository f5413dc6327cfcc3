"""Random-weight checkpoints in OpenVLA's exact Hugging Face layout (``vla-spec
make-checkpoint``): weights (incl. the unused vision keys), config.json with ``norm_stats`` for
two datasets, dataset_statistics.json and a small real tokenizer built with ``tokenizers``."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .checkpoint import build_model, save_model
from .config import VLAConfig, config_of
from .prompt import build_tokenizer, save_tokenizer

DTYPES = {'float32': torch.float32, 'float64': torch.float64, 'bfloat16': torch.bfloat16,
          'float16': torch.float16}


def synthetic_norm_stats(action_dim: int = 7, seed: int = 0) -> dict:
    """Two datasets with plausible EEF_POS statistics (gripper not normalised)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, scale in (('bridge_orig', 0.03), ('libero_goal', 0.9)):
        q99 = np.concatenate([rng.uniform(0.5, 1.0, action_dim - 1) * scale, [1.0]])
        q01 = np.concatenate([-rng.uniform(0.5, 1.0, action_dim - 1) * scale, [0.0]])
        mask = [True] * (action_dim - 1) + [False]
        out[name] = {
            'action': {'mean': ((q01 + q99) / 2).tolist(), 'std': ((q99 - q01) / 4).tolist(),
                       'max': (q99 * 1.5).tolist(), 'min': (q01 * 1.5).tolist(),
                       'q01': q01.tolist(), 'q99': q99.tolist(), 'mask': mask},
            'proprio': {k: [0.0] * 7 for k in ('mean', 'std', 'max', 'min', 'q01', 'q99')},
            'num_transitions': 1000, 'num_trajectories': 10,
        }
    return out


def make_checkpoint(cfg_or_preset: VLAConfig | str, out: str | Path, seed: int = 0,
                    dtype: str = 'float32', max_shard_bytes: int | None = None,
                    norm_stats: dict | None = None) -> Path:
    cfg = config_of(cfg_or_preset)
    if dtype not in DTYPES:
        raise ValueError(f'dtype: {dtype!r} not in {sorted(DTYPES)}')
    out = Path(out)
    tokenizer_vocab = cfg.pad_token_id
    if cfg.text_vocab_size > tokenizer_vocab + 1 or cfg.llm.vocab_size < tokenizer_vocab + 1:
        raise ValueError(f'vocab_size {cfg.llm.vocab_size} does not fit a {tokenizer_vocab}-id '
                         'tokenizer plus <PAD>')
    model = build_model(cfg, DTYPES[dtype], 'cpu', seed)
    save_model(model, cfg, out, norm_stats or synthetic_norm_stats(cfg.action_dim, seed),
               max_shard_bytes=max_shard_bytes, unused_seed=seed)
    save_tokenizer(build_tokenizer(tokenizer_vocab, seed), out)
    return out
