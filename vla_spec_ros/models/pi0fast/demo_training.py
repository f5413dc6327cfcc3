"""pi0-FAST's demo-training recipe: the embedded pi0-FAST model (``metaworld-demo-fast``),
trained from the same scripted Meta-World demos as ``metaworld-demo`` (``vla-spec
train-demo-vla --family pi0fast``; the loop, optimiser, schedule and augmentation are
train/demo_training.py's, which calls this).

1. text tokenizer: the family's small Gemma-style BPE (prompt.py here) over the prompt's words
   and the tasks' instructions, 1024 ids in all;
2. chunks: each transition's action and the next H - 1 of its episode (the last repeated past
   its end), normalised by the dataset's q01/q99 (``ActionStats``) and clipped to [-1, 1];
3. FAST tokenizer fitted on the TRAINING episodes' chunks only (codecs/fast_tokenizer.py), plus
   the two constant chunks -1 and +1 so that every normalised chunk stays encodable (a draft
   re-encoding any chunk never meets a coefficient below ``min_token``; fast_synthetic.py);
4. behaviour cloning in the family's own layout: image patches, ``[BOS] Task: ..., State:
   ...;\\n`` (zeros: the demos carry no proprioception), then the generated frame ``Action: ``
   + FAST ids + ``|`` + EOS (the codec's ``encode``), cross-entropy on every generated token
   (openpi's loss), teacher-forced with the prefix-LM mask (prefix_lm_forcing.py here);
5. the checkpoint in LeRobot's layout (checkpoint.py here), ``max_action_tokens`` = the longest
   training frame + ``FRAME_MARGIN``.

``init_from`` (a trained checkpoint of this recipe, e.g. the shipped model) continues from it
instead: its weights, its text and FAST tokenizers and its action statistics (the ids and the
normalisation must mean what they meant), on the new demonstrations.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...actions import ActionStats, chunk_actions
from ...codecs.fast_tokenizer import fit_fast_tokenizer
from ...config import config_to_dict
from .checkpoint import FAST_TOKENIZER_FOLDER, save_model
from .config import DEMO_PRESET, PRESETS
from .family import build_model, fast_codec, prompt_builder
from .prefix_lm_forcing import pixel_values_pi0fast, prefix_lm_batch, prefix_lm_logits
from .prompt import build_text_tokenizer
from .style import OPENPI

PRESET = DEMO_PRESET
FAST_VOCAB_SIZE = 512           # BPE ids asked for (1024 - 256 text - 128 skipped leaves 640)
FRAME_MARGIN = 8                # tokens beyond the longest training frame (max_action_tokens)
# openpi's conventions (style.py here): the frame ends at EOS after "|", the instruction
# lower-cased; what the shipped model was trained with.
STYLE = OPENPI


@dataclass
class FastDemoTensors:
    images: torch.Tensor            # (N, S, S, 3) uint8
    targets: list                   # per sample: the frame's token ids (codec.encode)
    prompt_ids: list                # per sample: prompt ids (BOS first)
    train_index: np.ndarray
    val_index: np.ndarray


def normalized_chunks(demos, stats: ActionStats, horizon: int) -> np.ndarray:
    """(N, H, D) normalised chunks in [-1, 1], one per transition."""
    chunks = chunk_actions(demos.actions, demos.episode_index, horizon)
    return np.clip(stats.normalize(chunks), -1.0, 1.0)


def fit_codec_tokenizer(chunks: np.ndarray, train_index: np.ndarray, folder: Path):
    """FAST on the training chunks, plus the constant chunks -1 and +1 (module docstring)."""
    horizon, dim = chunks.shape[1:]
    extremes = np.stack([np.full((horizon, dim), v) for v in (-1.0, 1.0)])
    return fit_fast_tokenizer(np.concatenate([chunks[train_index], extremes]),
                              vocab_size=FAST_VOCAB_SIZE, folder=folder)


def _copy_fast_tokenizer(init: Path, out: Path):
    """The trained checkpoint's FAST tokenizer, copied into ``out`` and read back."""
    import shutil
    from ...codecs.fast_tokenizer import FastTokenizer
    target = out / FAST_TOKENIZER_FOLDER
    if target.resolve() != (init / FAST_TOKENIZER_FOLDER).resolve():
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(init / FAST_TOKENIZER_FOLDER, target)
    return FastTokenizer.load(target)


def batch_loss(model, data: FastDemoTensors, index: np.ndarray, images: torch.Tensor,
               num_patches: int, pad_id: int):
    """Cross-entropy over every generated token of samples ``index`` (their ``images``,
    augmented or not); also returns the argmax and the targets (-100 past a frame's end)."""
    ids, _, mask, target, rows = prefix_lm_batch([data.prompt_ids[i] for i in index],
                                                 [data.targets[i] for i in index],
                                                 num_patches, pad_id)
    logits = prefix_lm_logits(model, pixel_values_pi0fast(images), ids, mask, rows)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=-100)
    return loss, logits.argmax(-1), target


@torch.no_grad()
def evaluate(model, data: FastDemoTensors, num_patches: int, pad_id: int,
             batch_size: int = 128) -> dict:
    """Held-out teacher-forced loss, token accuracy and whole-frame accuracy."""
    model.eval()
    loss_sum, correct, frames_right, count, num_tokens = 0.0, 0, 0, 0, 0
    for start in range(0, len(data.val_index), batch_size):
        index = data.val_index[start:start + batch_size]
        loss, pred, target = batch_loss(model, data, index,
                                        data.images[torch.from_numpy(index)], num_patches,
                                        pad_id)
        valid = target != -100
        loss_sum += float(loss) * int(valid.sum())
        correct += int(((pred == target) & valid).sum())
        frames_right += int(((pred == target) | ~valid).all(1).sum())
        num_tokens += int(valid.sum())
        count += len(index)
    model.train()
    if count == 0:
        return {}
    return {'val_loss': loss_sum / num_tokens, 'val_token_accuracy': correct / num_tokens,
            'val_frame_accuracy': frames_right / count}


class DemoRecipe:
    """Steps 1-4 of the module docstring at construction (the FAST tokenizer is written into
    ``out`` then); ``save`` is step 5 (train/demo_training.py names the calls)."""

    def __init__(self, cfg, demos, out: Path):
        if cfg.chunk < 2:
            raise ValueError(f'chunk: the pi0fast family decodes chunks of H >= 2 control '
                             f'steps (FAST compresses a chunk over time), got {cfg.chunk}')
        out.mkdir(parents=True, exist_ok=True)
        base = PRESETS[PRESET]()
        if demos.images.shape[1:3] != (base.image_size, base.image_size):
            raise ValueError(f'--data: images are {demos.images.shape[1:3]} pixels; {PRESET} '
                             f'needs {base.image_size} x {base.image_size}')
        instructions = sorted({str(text) for text in demos.instructions})
        init = Path(cfg.init_from) if getattr(cfg, 'init_from', '') else None
        if init is None:
            self.text_tok = build_text_tokenizer(base.llm.vocab_size, instructions=instructions)
            self.norm_stats = demos.norm_stats
        else:
            from tokenizers import Tokenizer

            from .checkpoint import load_model
            trained, trained_cfg, _ = load_model(init)
            if trained_cfg.chunk_size != cfg.chunk:
                raise ValueError(f'init_from: {init} decodes chunks of '
                                 f'{trained_cfg.chunk_size}, not --chunk {cfg.chunk}')
            self.text_tok = Tokenizer.from_file(str(init / 'tokenizer.json'))
            self.norm_stats = json.loads((init / 'dataset_statistics.json').read_text())
        (dataset_name, entry), = self.norm_stats.items()
        stats = ActionStats.from_norm_stats(entry, dataset_name)
        is_val = demos.episode_index % cfg.val_every_nth_episode == 0
        self.train_index, self.val_index = np.flatnonzero(~is_val), np.flatnonzero(is_val)
        chunks = normalized_chunks(demos, stats, cfg.chunk)
        if init is None:
            self.fast = fit_codec_tokenizer(chunks, self.train_index,
                                            out / FAST_TOKENIZER_FOLDER)
        else:
            self.fast = _copy_fast_tokenizer(init, out)
        vla_cfg = dataclasses.replace(base, chunk_size=cfg.chunk, action_dim=chunks.shape[2])
        prompt = prompt_builder(self.text_tok, vla_cfg, style=STYLE)
        codec = fast_codec(out / FAST_TOKENIZER_FOLDER, prompt, vla_cfg)
        targets = [codec.encode(c) for c in chunks]
        self.lengths = np.array([len(t) for t in targets])
        self.vla_cfg = dataclasses.replace(
            vla_cfg, max_action_tokens=int(self.lengths.max()) + FRAME_MARGIN)
        by_text = {text: prompt.encode(text) for text in instructions}
        self.data = FastDemoTensors(torch.from_numpy(demos.images), targets,
                                    [by_text[str(t)] for t in demos.instructions],
                                    self.train_index, self.val_index)
        self.images = self.data.images
        self.pad_id = self.text_tok.token_to_id('<pad>')
        self.model = build_model(self.vla_cfg, torch.float32, 'cpu', cfg.seed,
                                 style=STYLE).train()
        self.init_from = str(init) if init is not None else None
        if init is not None:
            self.model.load_state_dict(trained.state_dict(), strict=True)
            self.model.train()

    reads_init_from = True

    def batch_loss(self, index: np.ndarray, images: torch.Tensor):
        loss, pred, target = batch_loss(self.model, self.data, index, images,
                                        self.vla_cfg.num_patches, self.pad_id)
        valid = target != -100
        return loss, float(((pred == target) & valid).sum() / valid.sum())

    def evaluate(self) -> dict:
        return evaluate(self.model, self.data, self.vla_cfg.num_patches, self.pad_id)

    def summary(self) -> str:
        lengths = self.lengths
        return (f'{PRESET}: {sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M '
                f'parameters; {len(self.train_index)} training / {len(self.val_index)} '
                f'held-out transitions; FAST {self.fast.num_ids} ids, frames of '
                f'{lengths.min()}-{lengths.max()} tokens (mean {lengths.mean():.1f})')

    def save(self, out: Path) -> None:
        save_model(self.model, out)
        self.text_tok.save(str(out / 'tokenizer.json'))
        (out / 'dataset_statistics.json').write_text(json.dumps(self.norm_stats, indent=2))

    def report(self) -> dict:
        lengths, fast = self.lengths, self.fast
        return {'preset': PRESET, 'style': STYLE, 'model_config': config_to_dict(self.vla_cfg),
                'init_from': self.init_from,
                'fast': {'num_ids': fast.num_ids, 'min_token': fast.params.min_token,
                         'scale': fast.params.scale,
                         'fitted_on': ('training episodes only' if self.init_from is None
                                       else f'copied from {self.init_from}'),
                         'frame_tokens': {'min': int(lengths.min()), 'max': int(lengths.max()),
                                          'mean': float(lengths.mean())}}}


__all__ = ['PRESET', 'STYLE', 'FRAME_MARGIN', 'FAST_VOCAB_SIZE', 'DemoRecipe',
           'FastDemoTensors', 'normalized_chunks', 'fit_codec_tokenizer', 'batch_loss',
           'evaluate']
