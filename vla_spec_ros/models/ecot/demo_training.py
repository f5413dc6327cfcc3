"""ECoT's demo-training recipe: the embedded reasoning model (``metaworld-demo-reason``) from
scripted Meta-World demonstrations with reasoning written from the expert's state
(``vla-spec train-demo-vla --family ecot``; the loop, optimiser, schedule and augmentation are
train/demo_training.py's, which calls this).

1. text: per transition, the reasoning of demo_reasoning.py from the dataset's expert facts
   (``demos.expert_facts()``: the demonstrations must carry the expert's states and the
   camera's projection, ``collect-demos`` since 2026-11-29), then
   `` ACTION:``, "▁" and the 7 action tokens (OpenVLA's bins of the q01/q99-normalised
   action) as the answer after ECoT's prompt (prompt.py);
2. tokenizer: BPE learned from the prompts and the reasoning texts, 768 ids whose last 256 are
   the action bins (``openvla.prompt.build_text_tokenizer``);
3. targets and loss: teacher-forced cross-entropy on every answer token, the mean over the
   reasoning's tokens (marker and "▁" included) plus the mean over the 7 action tokens, so
   that the action weighs as much as the text around it; a held-out share of the episodes
   gives token accuracy of each part, the share of answers whose reasoning is right token for
   token, and the mean bin error;
4. the model: the ``metaworld-demo-reason`` preset, built seeded, or started from a trained
   OpenVLA-layout checkpoint (``init_from``: every tensor of the same shape, and of the token
   embeddings and head the action bins' rows), written in ECoT's layout (checkpoint.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...actions import ActionStats
from ...config import config_to_dict
from ..openvla.action_bins import ActionTokenizer
from ..openvla.checkpoint import init_random_
from ..openvla.prompt import PromptTokenizer, build_text_tokenizer
from ..openvla.teacher_forcing import action_logits, build_sequences, pixel_values_batch
from ..weights import load_state_dict, weight_files
from .checkpoint import save_checkpoint
from .config import DEMO_PRESET, PRESETS
from .demo_reasoning import reasoning_text
from .model import EcotVLA
from .prompt import EcotPrompt, format_prompt
from .reasoning_text import ACTION_TAG

PRESET = DEMO_PRESET
IGNORE = -100


@dataclass
class AnswerTensors:
    """Every transition's answer as token ids: ``targets`` (N, T) padded with IGNORE,
    ``lengths`` (N,), the last 7 of each the action."""

    images: torch.Tensor
    prompt_ids: list
    targets: np.ndarray
    lengths: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray


def demo_texts(demos) -> list[str]:
    """The reasoning text of every transition (step 1), from the dataset's expert facts."""
    return [reasoning_text(instruction, facts)
            for instruction, facts in zip(demos.instructions, demos.expert_facts())]


def answer_ids(prompt: EcotPrompt, texts: list[str], action_tokens: np.ndarray) -> list[list]:
    """Reasoning text + `` ACTION:`` + "▁" + action tokens, as the policy writes them."""
    marker = list(prompt.marker_ids())
    encoded = prompt.tokenizer.encode_batch([f'{t} {ACTION_TAG}' for t in texts],
                                            add_special_tokens=False)
    rows = []
    for enc, actions in zip(encoded, action_tokens):
        ids = list(enc.ids)
        if ids[-len(marker):] != marker:
            raise ValueError(f'tokenizer: "{ACTION_TAG}" after a reasoning does not encode as '
                             f'the marker {marker} (got {ids[-len(marker):]})')
        rows.append(ids + [prompt.space_id] + [int(t) for t in actions])
    return rows


def init_from_checkpoint(model: EcotVLA, folder: Path, num_action_ids: int,
                         pad_id: int) -> dict:
    """Copy a trained OpenVLA-layout checkpoint's weights into ``model`` (step 4); -> counts."""
    folder = Path(folder)
    mapping = weight_files(folder)
    from safetensors import safe_open
    shapes = {}
    for key, path in mapping.items():
        with safe_open(str(path), 'pt') as f:
            shapes[key] = tuple(f.get_slice(key).get_shape())
    own = model.state_dict()
    wanted = {k: shapes[k] for k in own if k in shapes}
    state = load_state_dict(folder, wanted, set(shapes) - set(wanted), torch.float32, 'cpu',
                            mapping)
    other_pad = int(json.loads((folder / 'config.json').read_text())['pad_token_id'])
    copied, rows = 0, 0
    with torch.no_grad():
        for key, value in state.items():
            target = own[key]
            if tuple(value.shape) == tuple(target.shape):
                target.copy_(value)
                copied += 1
            elif value.dim() == 2 and value.shape[1] == target.shape[1]:
                target[pad_id - num_action_ids:pad_id] = value[other_pad - num_action_ids:
                                                               other_pad]
                rows += 1
    return {'init_from': str(folder), 'tensors_copied': copied, 'action_rows_copied': rows}


class DemoRecipe:
    """Steps 1-3 at construction; ``save`` writes step 4's checkpoint."""

    reads_init_from = True

    def __init__(self, cfg, demos, out: Path):
        self.vla_cfg = vla_cfg = PRESETS[PRESET]()
        if demos.images.shape[1:3] != (vla_cfg.image_size, vla_cfg.image_size):
            raise ValueError(f'--data: images are {demos.images.shape[1:3]} pixels; '
                             f'{PRESET} needs {vla_cfg.image_size}')
        texts = demo_texts(demos)
        prompts = [format_prompt(t) for t in sorted(set(demos.instructions))]
        self.tokenizer = build_text_tokenizer(prompts + sorted(set(texts)),
                                              vla_cfg.pad_token_id, vla_cfg.n_action_bins)
        self.prompt = EcotPrompt(PromptTokenizer(self.tokenizer))
        (dataset_name, entry), = demos.norm_stats.items()
        stats = ActionStats.from_norm_stats(entry, dataset_name)
        bins = ActionTokenizer(vla_cfg.llm.vocab_size, vla_cfg.pad_to_multiple_of,
                               vla_cfg.n_action_bins, vla_cfg.action_dim, 1)
        actions = bins.encode(stats.normalize(demos.actions)).reshape(len(demos.actions), -1)
        rows = answer_ids(self.prompt, texts, actions)
        lengths = np.array([len(r) for r in rows])
        targets = np.full((len(rows), lengths.max()), IGNORE, dtype=np.int64)
        for i, r in enumerate(rows):
            targets[i, :len(r)] = r
        by_text = {t: self.prompt.encode(t) for t in np.unique(demos.instructions)}
        is_val = demos.episode_index % cfg.val_every_nth_episode == 0
        self.data = AnswerTensors(torch.from_numpy(demos.images),
                                  [by_text[t] for t in demos.instructions], targets, lengths,
                                  np.flatnonzero(~is_val), np.flatnonzero(is_val))
        self.norm_stats, self.seed = demos.norm_stats, cfg.seed
        torch.manual_seed(cfg.seed)
        self.model = EcotVLA(vla_cfg)
        init_random_(self.model)
        self.model.use_prompt(self.prompt)
        self.init_report = ({} if not getattr(cfg, 'init_from', '') else init_from_checkpoint(
            self.model, Path(cfg.init_from), vla_cfg.n_action_bins, vla_cfg.pad_token_id))
        self.model.train()
        self.images = self.data.images
        self.train_index, self.val_index = self.data.train_index, self.data.val_index

    def _logits(self, index: np.ndarray, images: torch.Tensor):
        data = self.data
        width = int(data.lengths[index].max())
        targets = data.targets[index, :width]
        ids, text_lens = build_sequences([data.prompt_ids[i] for i in index],
                                         np.where(targets == IGNORE, self.vla_cfg.pad_token_id,
                                                  targets), self.vla_cfg.pad_token_id)
        logits = action_logits(self.model, pixel_values_batch(images, self.vla_cfg), ids,
                               text_lens, width)
        target_t = torch.from_numpy(targets)
        positions = torch.arange(width)[None, :]
        lengths = torch.from_numpy(data.lengths[index])[:, None]
        is_action = (positions >= lengths - self.vla_cfg.action_dim) & (positions < lengths)
        is_text = positions < lengths - self.vla_cfg.action_dim
        return logits, target_t, is_action, is_text

    def batch_loss(self, index: np.ndarray, images: torch.Tensor):
        logits, targets, is_action, is_text = self._logits(index, images)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                             ignore_index=IGNORE, reduction='none').reshape(targets.shape)
        loss = ce[is_text].mean() + ce[is_action].mean()
        correct = logits.argmax(-1) == targets
        return loss, float(correct[is_action].float().mean())

    @torch.no_grad()
    def evaluate(self, batch_size: int = 128) -> dict:
        """Held-out: loss, token accuracy of the reasoning and of the action, the share of
        answers whose whole reasoning is right, the mean |bin error| per action dimension."""
        self.model.eval()
        sums = dict(loss=0.0, text=0, text_n=0, action=0, action_n=0, whole=0, n=0)
        bin_error = np.zeros(self.vla_cfg.action_dim)
        for start in range(0, len(self.val_index), batch_size):
            index = self.val_index[start:start + batch_size]
            images = self.data.images[torch.from_numpy(index)]
            logits, targets, is_action, is_text = self._logits(index, images)
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                 ignore_index=IGNORE, reduction='none').reshape(targets.shape)
            pred = logits.argmax(-1)
            correct = pred == targets
            sums['loss'] += float((ce[is_text].mean() + ce[is_action].mean()) * len(index))
            sums['text'] += int(correct[is_text].sum())
            sums['text_n'] += int(is_text.sum())
            sums['action'] += int(correct[is_action].sum())
            sums['action_n'] += int(is_action.sum())
            sums['whole'] += int((correct | ~is_text).all(dim=1).sum())
            sums['n'] += len(index)
            diff = (pred[is_action] - targets[is_action]).abs().reshape(len(index), -1)
            bin_error += diff.double().sum(0).numpy()
        self.model.train()
        if sums['n'] == 0:
            return {}
        return {'val_loss': sums['loss'] / sums['n'],
                'val_reasoning_token_accuracy': sums['text'] / sums['text_n'],
                'val_token_accuracy': sums['action'] / sums['action_n'],
                'val_reasoning_exact': sums['whole'] / sums['n'],
                'val_mean_bin_error': (bin_error / sums['n']).tolist()}

    def summary(self) -> str:
        lengths = self.data.lengths - self.vla_cfg.action_dim - 1
        return (f'{PRESET}: {sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M '
                f'parameters; {len(self.train_index)} training / {len(self.val_index)} '
                f'held-out transitions; reasoning tokens (marker included) min '
                f'{lengths.min()}, mean {lengths.mean():.1f}, max {lengths.max()}; '
                f'{self.init_report or "random start"}')

    def save(self, out: Path) -> None:
        save_checkpoint(self.model.eval(), self.vla_cfg, out, self.norm_stats, self.tokenizer,
                        self.seed, {'vla_spec_family': 'ecot'})

    def report(self) -> dict:
        lengths = self.data.lengths - self.vla_cfg.action_dim - 1
        return {'preset': PRESET, 'model_config': config_to_dict(self.vla_cfg),
                'reasoning_tokens': {'min': int(lengths.min()), 'mean': float(lengths.mean()),
                                     'max': int(lengths.max())}, **self.init_report}


__all__ = ['PRESET', 'AnswerTensors', 'DemoRecipe', 'answer_ids', 'demo_texts',
           'init_from_checkpoint']
