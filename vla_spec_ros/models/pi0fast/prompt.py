"""pi0-FAST's prompt (LeRobot's pi0_fast processor; openpi's ``FASTTokenizer.tokenize``)::

    [BOS] Task: {instruction}, State: {s_1 s_2 ... s_N};\\n [BOS]

in one of two styles (style.py), the checkpoint's setting:

- ``lerobot``: the instruction stripped, "_" and newlines replaced by spaces, case kept; the
  state normalised with the checkpoint's state statistics (LeRobot's normaliser, float32;
  statistics.py) when it has them, then ``state_dim`` bins; the second BOS after the prompt
  (LeRobot's ``sample_actions_fast*`` append it). The prompt with its first BOS must fit
  ``tokenizer_max_length`` (LeRobot would cut it there, state included): a longer one is
  refused.
- ``openpi``: the instruction lower-cased as well; the (already normalised) state zero-padded to
  ``max_state_dim``; no second BOS.

``s_i``: ``digitize(x, linspace(-1, 1, 257)[:-1]) - 1`` (``model.discretize_state``; -1 below
-1, 255 from 1 - 2/256 on, as in both), written as decimal integers. The model then generates
``Action: `` and the FAST tokens itself.

The text tokenizer is the checkpoint's (PaliGemma's Gemma tokenizer: BOS ``<bos>``, EOS
``<eos>``), read from its ``tokenizer.json`` with ``tokenizers``; nothing is fetched.
``build_text_tokenizer`` makes a small Gemma-style one for random-weight checkpoints: ids 0-3
``<pad> <eos> <bos> <unk>`` as in Gemma, a BPE over the prompt's words and every digit, then
``<unused_k>`` placeholders up to the vocabulary size (the FAST ids and the 128 skipped ids live
there), all in the BPE vocabulary, so that transformers' ``vocab_size`` (which LeRobot's FAST id
mapping reads and which leaves added tokens out) is the whole vocabulary.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ...instruction import PromptError, checked_instruction
from .model import discretize_state
from .style import DEFAULT_STYLE, LEROBOT, OPENPI, check_style

BOS, EOS = '<bos>', '<eos>'
ACTION_PREFIX = 'Action: '      # what the model generates before the FAST ids
ACTION_SUFFIX = '|'             # what it generates after them (then EOS)


TOKENIZER_MAX_LENGTH = 200     # LeRobot's tokenizer_max_length default


def clean_instruction(instruction: str, lowercase: bool = True) -> str:
    text = instruction.strip().replace('_', ' ').replace('\n', ' ')
    return text.lower() if lowercase else text


def format_prompt(instruction: str, bins: np.ndarray) -> str:
    return f'Task: {instruction}, State: {" ".join(str(int(b)) for b in bins)};\n'


class Pi0FastPrompt:
    """The model protocol's ``PromptBuilder`` for pi0-FAST (module docstring).
    ``state_normalizer``: the checkpoint's (statistics.StateNormalizer), applied to every given
    state; None: a given state is already normalised."""

    def __init__(self, tokenizer: Tokenizer, *, state_dim: int, max_state_dim: int,
                 style: str = DEFAULT_STYLE, state_normalizer=None,
                 max_instruction_tokens: int = 128,
                 tokenizer_max_length: int = TOKENIZER_MAX_LENGTH, source: str = '<memory>'):
        self.tokenizer = tokenizer
        self.state_dim = state_dim
        self.max_state_dim = max_state_dim
        self.style = check_style(style)
        self.lowercase = style == OPENPI
        self.state_normalizer = state_normalizer
        self.max_instruction_tokens = max_instruction_tokens
        self.tokenizer_max_length = tokenizer_max_length
        self.bos_id = tokenizer.token_to_id(BOS)
        self.eos_id = tokenizer.token_to_id(EOS)
        if self.bos_id is None or self.eos_id is None:
            raise ValueError(f'{source}: tokenizer lacks "{BOS}" or "{EOS}"')
        if state_normalizer is not None and state_normalizer.state_dim != state_dim:
            raise ValueError(f'{source}: state statistics of {state_normalizer.state_dim} '
                             f'dimensions; the state has {state_dim}')
        # The longest state text: every bin written with three digits.
        bins = max_state_dim if style == OPENPI else state_dim
        longest = format_prompt('', np.full(bins, 255))
        self.prompt_overhead = len(self._encode_raw(longest)) + (style == LEROBOT)

    @classmethod
    def from_folder(cls, folder, **kwargs) -> 'Pi0FastPrompt':
        """``folder``/tokenizer.json."""
        path = Path(folder) / 'tokenizer.json'
        if not path.is_file():
            raise FileNotFoundError(f'missing tokenizer file {path}')
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise ValueError(f'{path}: cannot load tokenizer ({exc})') from exc
        return cls(tok, source=str(path), **kwargs)

    def _encode_raw(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id] + ids

    def text_ids(self, text: str) -> list[int]:
        """Ids of ``text`` without BOS (the codec's ``Action: `` and ``|``)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def max_prompt_len(self, max_instruction_tokens: int) -> int:
        return self.prompt_overhead + max_instruction_tokens + 8

    def state_bins(self, state=None) -> np.ndarray:
        """The state's bins as the prompt writes them (module docstring). ``state`` None: a
        normalised state of zeros (bin 128 everywhere: a robot without a state topic;
        docs/pi0fast.md); else the robot's state (normalised here by the checkpoint's
        statistics, if it has them)."""
        if state is None:
            normalized = np.zeros(self.state_dim)
        else:
            array = np.asarray(state, dtype=np.float64).reshape(-1)
            if self.style == LEROBOT and array.shape[0] != self.state_dim:
                raise ValueError(f'state: {array.shape[0]} dimensions; the checkpoint\'s '
                                 f'state has {self.state_dim}')
            if not np.isfinite(array).all():
                raise ValueError(f'state: non-finite values {array.tolist()}')
            normalized = array
            if self.state_normalizer is not None:
                # LeRobot reads the observation in float32 and normalises it in float32.
                normalized = self.state_normalizer(np.asarray(state, dtype=np.float32))
        return discretize_state(normalized,
                                self.max_state_dim if self.style == OPENPI else None)

    def encode(self, instruction: str, state=None) -> list[int]:
        """-> prompt ids, BOS first (``state_bins`` for ``state``)."""
        if not isinstance(instruction, str):
            raise PromptError(f'instruction must be a str, got {type(instruction).__name__}')
        # The family's cleaning first (it may empty a text of punctuation), then the checks
        # every family shares.
        text = checked_instruction(clean_instruction(instruction, self.lowercase))
        num_tokens = len(self.text_ids(text))
        if num_tokens > self.max_instruction_tokens:
            raise PromptError(f'instruction has {num_tokens} tokens; the limit '
                              f'(max_instruction_tokens) is {self.max_instruction_tokens}')
        try:
            bins = self.state_bins(state)
        except ValueError as exc:
            raise PromptError(str(exc)) from exc
        ids = self._encode_raw(format_prompt(text, bins))
        if self.style == OPENPI:
            return ids
        if len(ids) > self.tokenizer_max_length:
            raise PromptError(f'the prompt has {len(ids)} tokens; LeRobot\'s '
                              f'tokenizer_max_length is {self.tokenizer_max_length} (it would '
                              'cut the prompt there)')
        return ids + [self.bos_id]


# ---- a small Gemma-style tokenizer for random-weight checkpoints ----------------------------

_WORDS = ('Task State Action pick place put push pull open close lift move the a to on in of '
          'and up down left right red green blue cup bowl block drawer door object robot arm '
          'gripper slowly').split()


def build_text_tokenizer(vocab_size: int, num_text_ids: int = 256,
                         instructions: Sequence[str] = ()) -> Tokenizer:
    """A BPE text tokenizer of exactly ``vocab_size`` ids: Gemma's special ids 0-3, at most
    ``num_text_ids`` learned ids (the prompt's words and ``instructions`` as the prompt
    writes them, digits one by one, punctuation), then ``<unused_k>`` placeholders.
    Deterministic."""
    tok = Tokenizer(models.BPE(unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement='\u2581', prepend_scheme='never'),
        pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.Metaspace(replacement='\u2581', prepend_scheme='never')
    alphabet = sorted(set('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'
                          ',.;:|!?-\'"\n\u2581'))
    trainer = trainers.BpeTrainer(vocab_size=num_text_ids, min_frequency=1,
                                  special_tokens=['<pad>', EOS, BOS, '<unk>'],
                                  initial_alphabet=alphabet, show_progress=False)
    lines = [f'Task: {w} {v} {u}, State: 1 22 128 255;\n{ACTION_PREFIX}{ACTION_SUFFIX}'
             for w in _WORDS for v in _WORDS[::5] for u in _WORDS[::7]]
    lines += [f'Task: {clean_instruction(text)}, State: 128;\n{ACTION_PREFIX}{ACTION_SUFFIX}'
              for text in instructions for _ in range(8)]
    tok.train_from_iterator(lines, trainer=trainer)
    learned = tok.get_vocab_size()
    if learned > vocab_size:
        raise ValueError(f'vocab_size: {vocab_size} is below the {learned} text ids')
    # The placeholders join the BPE vocabulary (no merge produces them), not the added tokens.
    data = json.loads(tok.to_str())
    data['model']['vocab'].update({f'<unused_{i}>': learned + i
                                   for i in range(vocab_size - learned)})
    tok = Tokenizer.from_str(json.dumps(data))
    tok.post_processor = processors.TemplateProcessing(single=f'{BOS} $A',
                                                       special_tokens=[(BOS, 2)])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f'tokenizer has {tok.get_vocab_size()} ids, wanted {vocab_size}')
    return tok
