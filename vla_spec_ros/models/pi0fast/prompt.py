"""pi0-FAST's prompt (openpi's ``FASTTokenizer.tokenize``, LeRobot's pi0_fast processor):

    [BOS] Task: {instruction}, State: {s_1 s_2 ... s_N};\\n

``instruction``: stripped, "_" and newlines replaced by spaces, lower-cased (openpi; LeRobot
0.6 keeps the case: ``lowercase_instruction`` false). ``s_i``: the normalised state zero-padded
to ``max_state_dim`` and cut into 256 bins over [-1, 1] (``model.discretize_state``), written
as decimal integers. The model then generates ``Action: `` and the FAST tokens itself.

The text tokenizer is the checkpoint's ``tokenizer.json`` (PaliGemma's Gemma tokenizer: BOS
``<bos>``, EOS ``<eos>``), read with ``tokenizers``; nothing is fetched. ``build_text_tokenizer``
makes a small Gemma-style one for random-weight checkpoints: ids 0-3 ``<pad> <eos> <bos>
<unk>`` as in Gemma, a BPE over the prompt's words and every digit, then ``<unused_k>``
placeholders up to the vocabulary size (the FAST ids and the 128 skipped ids live there).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ...prompt import MAX_INSTRUCTION_CHARS, PromptError
from .model import discretize_state

BOS, EOS = '<bos>', '<eos>'
ACTION_PREFIX = 'Action: '      # what the model generates before the FAST ids
ACTION_SUFFIX = '|'             # what it generates after them (then EOS)


def clean_instruction(instruction: str, lowercase: bool = True) -> str:
    text = instruction.strip().replace('_', ' ').replace('\n', ' ')
    return text.lower() if lowercase else text


def format_prompt(instruction: str, bins: np.ndarray) -> str:
    return f'Task: {instruction}, State: {" ".join(str(int(b)) for b in bins)};\n'


class Pi0FastPrompt:
    """The model protocol's ``PromptBuilder`` for pi0-FAST (module docstring)."""

    def __init__(self, tokenizer: Tokenizer, *, state_dim: int, max_state_dim: int,
                 lowercase_instruction: bool = True, max_instruction_tokens: int = 128,
                 source: str = '<memory>'):
        self.tokenizer = tokenizer
        self.state_dim = state_dim
        self.max_state_dim = max_state_dim
        self.lowercase = lowercase_instruction
        self.max_instruction_tokens = max_instruction_tokens
        self.bos_id = tokenizer.token_to_id(BOS)
        self.eos_id = tokenizer.token_to_id(EOS)
        if self.bos_id is None or self.eos_id is None:
            raise ValueError(f'{source}: tokenizer lacks "{BOS}" or "{EOS}"')
        # The longest state text: every bin written with three digits.
        longest = format_prompt('', np.full(max_state_dim, 255))
        self.prompt_overhead = len(self._encode_raw(longest))

    @classmethod
    def from_folder(cls, folder, **kwargs) -> 'Pi0FastPrompt':
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

    def encode(self, instruction: str, state=None) -> list[int]:
        """-> prompt ids, BOS first. ``state`` None: zeros (a robot without a state topic;
        docs/pi0fast.md); else a normalised vector of at most ``max_state_dim`` values."""
        if not isinstance(instruction, str):
            raise PromptError(f'instruction must be a str, got {type(instruction).__name__}')
        text = clean_instruction(instruction, self.lowercase)
        if not text:
            raise PromptError('instruction is empty')
        if len(text) > MAX_INSTRUCTION_CHARS:
            raise PromptError(f'instruction has {len(text)} characters; the limit is '
                              f'{MAX_INSTRUCTION_CHARS}')
        num_tokens = len(self.text_ids(text))
        if num_tokens > self.max_instruction_tokens:
            raise PromptError(f'instruction has {num_tokens} tokens; the limit '
                              f'(max_instruction_tokens) is {self.max_instruction_tokens}')
        if state is None:
            state = np.zeros(self.state_dim)
        try:
            bins = discretize_state(state, self.max_state_dim)
        except ValueError as exc:
            raise PromptError(str(exc)) from exc
        return self._encode_raw(format_prompt(text, bins))


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
    tok.add_tokens([f'<unused_{i}>' for i in range(vocab_size - learned)])
    tok.post_processor = processors.TemplateProcessing(single=f'{BOS} $A',
                                                       special_tokens=[(BOS, 2)])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f'tokenizer has {tok.get_vocab_size()} ids, wanted {vocab_size}')
    return tok
