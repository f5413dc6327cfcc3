"""OpenVLA's demo-training recipe: the embedded default model (``metaworld-demo``) from scripted
Meta-World demonstrations (``vla-spec train-demo-vla``; the loop, optimiser, schedule and
augmentation are train/demo_training.py's, which calls this).

1. tokenizer: BPE learned from the tasks' instruction prompts (prompt.build_instruction_
   tokenizer), the last 256 of its 512 ids reserved for the action bins;
2. targets: OpenVLA's objective, cross-entropy on the 7 action tokens given image + prompt
   (with ``chunk`` K: the 7 K tokens of the next K control steps of the episode, the last step
   repeated past its end), the actions normalised by the dataset's q01/q99 and binned by
   ``ActionTokenizer``; a held-out share of the episodes for token accuracy and bin error;
3. the model: the ``metaworld-demo`` preset (the same model code as inference), the batched
   teacher-forced forward of teacher_forcing.py;
4. the checkpoint in OpenVLA's layout (safetensors, config.json with norm_stats, tokenizer);
   demo training then trains its EAGLE draft head (``trains_draft_head`` in entry.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...actions import ActionStats, chunk_actions
from ...config import config_to_dict
from .action_bins import ActionTokenizer
from .checkpoint import build_model, save_model
from .config import DEMO_PRESET, PRESETS
from .prompt import PromptTokenizer, build_instruction_tokenizer, save_tokenizer
from .teacher_forcing import action_logits, build_sequences, pixel_values_batch

PRESET = DEMO_PRESET


@dataclass
class DemoTensors:
    """The dataset as training tensors, split by episode into train and held-out parts."""

    images: torch.Tensor            # (N, S, S, 3) uint8
    action_tokens: np.ndarray       # (N, 7 * chunk) int64
    prompt_ids: list                # per sample: prompt ids (BOS first)
    train_index: np.ndarray
    val_index: np.ndarray


def prepare_tensors(demos, tokenizer: PromptTokenizer, action_tokenizer: ActionTokenizer,
                    stats: ActionStats, image_size: int, val_every_nth_episode: int,
                    chunk: int = 1) -> DemoTensors:
    if demos.images.shape[1:3] != (image_size, image_size):
        raise ValueError(f'--data: images are {demos.images.shape[1:3]} pixels; the '
                         f'{PRESET} preset needs {image_size} x {image_size} (collect with '
                         f'--image-size {image_size})')
    by_text = {text: tokenizer.encode(text) for text in np.unique(demos.instructions)}
    prompt_ids = [by_text[text] for text in demos.instructions]
    actions = chunk_actions(demos.actions, demos.episode_index, chunk)
    tokens = action_tokenizer.encode(stats.normalize(actions)).reshape(len(actions), -1)
    is_val = demos.episode_index % val_every_nth_episode == 0
    return DemoTensors(torch.from_numpy(demos.images), tokens.astype(np.int64), prompt_ids,
                       np.flatnonzero(~is_val), np.flatnonzero(is_val))


def batch_loss(model, data: DemoTensors, index: np.ndarray, images: torch.Tensor, cfg,
               pad_id: int):
    """Cross-entropy over the action tokens of samples ``index`` (their ``images``, augmented
    or not); also returns the argmax and the targets."""
    targets = data.action_tokens[index]
    ids, text_lens = build_sequences([data.prompt_ids[i] for i in index], targets, pad_id)
    logits = action_logits(model, pixel_values_batch(images, cfg), ids, text_lens,
                           targets.shape[1])
    target_t = torch.from_numpy(targets)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_t.reshape(-1))
    return loss, logits.argmax(-1), target_t


@torch.no_grad()
def evaluate(model, data: DemoTensors, cfg, pad_id: int, batch_size: int = 256) -> dict:
    """Held-out token accuracy, mean |bin error| per action dimension, mean loss."""
    model.eval()
    losses, correct, bin_err, count = [], 0, None, 0
    for start in range(0, len(data.val_index), batch_size):
        index = data.val_index[start:start + batch_size]
        loss, pred, target = batch_loss(model, data, index,
                                        data.images[torch.from_numpy(index)], cfg, pad_id)
        losses.append(float(loss) * len(index))
        correct += int((pred == target).sum())
        err = (pred - target).abs().double().sum(0)
        bin_err = err if bin_err is None else bin_err + err
        count += len(index)
    model.train()
    if count == 0:
        return {}
    return {'val_loss': sum(losses) / count,
            'val_token_accuracy': correct / (count * data.action_tokens.shape[1]),
            'val_mean_bin_error': (bin_err / count).tolist()}


class DemoRecipe:
    """Steps 1-3 of the module docstring at construction; ``save`` is step 4
    (train/demo_training.py names the calls)."""

    def __init__(self, cfg, demos, out: Path):
        self.vla_cfg = vla_cfg = dataclasses.replace(PRESETS[PRESET](), action_chunk=cfg.chunk)
        task_instructions = sorted({text for text in demos.instructions})
        self.tokenizer = build_instruction_tokenizer(task_instructions, vla_cfg.pad_token_id,
                                                     vla_cfg.n_action_bins)
        action_tokenizer = ActionTokenizer(vla_cfg.llm.vocab_size, vla_cfg.pad_to_multiple_of,
                                           vla_cfg.n_action_bins, vla_cfg.action_dim,
                                           vla_cfg.action_chunk)
        (dataset_name, entry), = demos.norm_stats.items()
        stats = ActionStats.from_norm_stats(entry, dataset_name)
        self.data = prepare_tensors(demos, PromptTokenizer(self.tokenizer), action_tokenizer,
                                    stats, vla_cfg.image_size, cfg.val_every_nth_episode,
                                    cfg.chunk)
        self.norm_stats, self.seed = demos.norm_stats, cfg.seed
        self.model = build_model(vla_cfg, torch.float32, 'cpu', cfg.seed).train()
        self.images = self.data.images
        self.train_index, self.val_index = self.data.train_index, self.data.val_index

    def batch_loss(self, index: np.ndarray, images: torch.Tensor):
        loss, pred, target = batch_loss(self.model, self.data, index, images, self.vla_cfg,
                                        self.vla_cfg.pad_token_id)
        return loss, float((pred == target).float().mean())

    def evaluate(self) -> dict:
        return evaluate(self.model, self.data, self.vla_cfg, self.vla_cfg.pad_token_id)

    def summary(self) -> str:
        return (f'{PRESET}: {sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M '
                f'parameters; {len(self.train_index)} training / {len(self.val_index)} '
                'held-out transitions')

    def save(self, out: Path) -> None:
        save_model(self.model, self.vla_cfg, out, self.norm_stats, unused_seed=self.seed)
        save_tokenizer(self.tokenizer, out)

    def report(self) -> dict:
        return {'preset': PRESET, 'model_config': config_to_dict(self.vla_cfg)}


__all__ = ['PRESET', 'DemoRecipe', 'DemoTensors', 'prepare_tensors', 'batch_loss', 'evaluate']
