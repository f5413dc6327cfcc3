"""OpenVLA v1 prompt and tokenizer (docs/openvla.md, Prompt).

The prompt is ``In: What action should the robot take to {instruction.lower()}?\\nOut:``,
tokenized with BOS first and no EOS; the "▁" token (29871 for Llama) is appended when the last
id is not already it, because training saw ``...Out: `` followed by the action tokens.
Tokenizers load from the checkpoint's local ``tokenizer.json`` through ``tokenizers`` (the engine
behind transformers' fast Llama tokenizer); nothing is fetched and no remote code runs.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ...instruction import PromptError, checked_instruction
from ..weights import CheckpointError

PROMPT_TEMPLATE = 'In: What action should the robot take to {}?\nOut:'
SPACE_PIECE = '\u2581'   # "▁", SentencePiece's word-boundary marker
PAD_TOKEN = '<PAD>'         # OpenVLA adds it after Llama's ids: config.json's pad_token_id


def format_prompt(instruction: str) -> str:
    return PROMPT_TEMPLATE.format(instruction.lower())


class PromptTokenizer:
    def __init__(self, tokenizer: Tokenizer, max_instruction_tokens: int = 128,
                 source: str = '<memory>'):
        self.tokenizer = tokenizer
        self.source = source
        self.max_instruction_tokens = max_instruction_tokens
        self.bos_id = tokenizer.token_to_id('<s>')
        self.space_id = tokenizer.token_to_id(SPACE_PIECE)
        if self.bos_id is None or self.space_id is None:
            raise ValueError(f'{source}: tokenizer lacks "<s>" or "{SPACE_PIECE}"')
        self.prompt_overhead = len(self._encode_raw(format_prompt('')))

    @classmethod
    def from_folder(cls, folder: str | Path, max_instruction_tokens: int = 128):
        path = Path(folder) / 'tokenizer.json'
        if not path.is_file():
            raise FileNotFoundError(f'missing tokenizer file {path}')
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise ValueError(f'{path}: cannot load tokenizer ({exc})') from exc
        return cls(tok, max_instruction_tokens, str(path))

    def _encode_raw(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=True).ids
        if not ids or ids[0] != self.bos_id:
            ids = [self.bos_id] + ids   # OpenVLA's prompts always start with BOS
        return ids

    def max_prompt_len(self, max_instruction_tokens: int) -> int:
        """Most ids ``encode`` returns for an instruction of ``max_instruction_tokens`` tokens
        (BOS, template, "▁" included; +8: tokenisation of the template around an instruction
        may merge differently)."""
        return self.prompt_overhead + max_instruction_tokens + 8

    def encode(self, instruction: str, state=None) -> list[int]:
        """Instruction -> prompt token ids (BOS first, trailing "▁" rule applied). OpenVLA's
        prompt reads no robot state: a state is refused rather than ignored."""
        if state is not None:
            raise PromptError('state: this model\'s prompt reads no robot state')
        text = checked_instruction(instruction)
        ids = self._encode_raw(format_prompt(text))
        num_instruction_tokens = len(ids) - self.prompt_overhead
        if num_instruction_tokens > self.max_instruction_tokens:
            raise PromptError(f'instruction has {num_instruction_tokens} tokens; the limit '
                              f'(max_instruction_tokens) is {self.max_instruction_tokens}')
        if ids[-1] != self.space_id:
            ids.append(self.space_id)
        return ids


def check_tokenizer_fits(tokenizer: PromptTokenizer, cfg) -> None:
    """The tokenizer must be the one the model's config describes (``cfg``: a ``VLAConfig``):
    its ``<PAD>`` is the config's ``pad_token_id`` and every other id lies in the text
    vocabulary V (vocab_size - pad_to_multiple_of), whose top ``n_action_bins`` ids the model
    reads as actions. Another checkpoint's tokenizer passes every other check and feeds the
    model prompts it never saw (CheckpointError naming the file and both numbers)."""
    source = tokenizer.source
    pad_id = tokenizer.tokenizer.token_to_id(PAD_TOKEN)
    if pad_id != cfg.pad_token_id:
        found = 'has no ' + PAD_TOKEN if pad_id is None else f'has {PAD_TOKEN} = id {pad_id}'
        raise CheckpointError(f'{source}: the tokenizer {found}; config.json\'s pad_token_id '
                              f'is {cfg.pad_token_id}: it is not this model\'s tokenizer')
    largest = max(i for i in tokenizer.tokenizer.get_vocab().values() if i != pad_id)
    if largest >= cfg.text_vocab_size:
        raise CheckpointError(f'{source}: the tokenizer has ids up to {largest}; the model\'s '
                              f'text vocabulary is {cfg.text_vocab_size} ids (vocab_size '
                              f'{cfg.llm.vocab_size} - pad_to_multiple_of '
                              f'{cfg.pad_to_multiple_of}): it is not this model\'s tokenizer')


# ---- a small real tokenizer for random-weight and embedded checkpoints ----------------------

_WORDS = ('pick place put push pull open close press turn lift move slide reach grasp stack '
          'the a an to on in into of from with and then up down left right top bottom front back '
          'red green blue yellow black white small large cup bowl plate block drawer door window '
          'button handle lid box bottle mug shelf table cabinet stove microwave sink basket '
          'object target goal robot arm gripper gently quickly slowly carefully toward away '
          'what action should take out').split()


def _corpus(num_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = 'abcdefghijklmnopqrstuvwxyz'
    lines = [format_prompt(' '.join(rng.choice(_WORDS) for _ in range(rng.randint(3, 9))))
             for _ in range(num_lines)]
    # Pseudo-words give BPE enough distinct merges to fill the vocabulary exactly.
    lines += [' '.join(''.join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
                       for _ in range(12)) for _ in range(num_lines)]
    return lines


def build_tokenizer(vocab_size: int, seed: int = 0, extra_text: list[str] | None = None
                    ) -> Tokenizer:
    """Train a Llama-style (Metaspace + BPE) tokenizer of exactly ``vocab_size`` ids, then add
    ``<PAD>`` as id ``vocab_size`` (OpenVLA adds ``<PAD>`` = 32000 after Llama's 32000)."""
    tok = Tokenizer(models.BPE(unk_token='<unk>', fuse_unk=True, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_PIECE,
                                                 prepend_scheme='first')
    tok.decoder = decoders.Metaspace(replacement=SPACE_PIECE, prepend_scheme='first')
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=['<unk>', '<s>', '</s>'],
                                  initial_alphabet=list('abcdefghijklmnopqrstuvwxyz'
                                                        'ABCDEFGHIJKLMNOPQRSTUVWXYZ'
                                                        '0123456789?:,.!-\'\n' + SPACE_PIECE),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(4000, seed) + list(extra_text or []), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f'tokenizer training produced {tok.get_vocab_size()} ids, '
                         f'wanted {vocab_size}')
    tok.post_processor = processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', 1)])
    tok.add_special_tokens([PAD_TOKEN])
    return tok


def save_tokenizer(tok: Tokenizer, folder: str | Path) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / 'tokenizer.json'))
    (folder / 'tokenizer_config.json').write_text(json.dumps({
        'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<s>', 'eos_token': '</s>',
        'unk_token': '<unk>', 'pad_token': '<PAD>', 'add_bos_token': True,
        'add_eos_token': False, 'model_max_length': 2048}, indent=2))
    (folder / 'special_tokens_map.json').write_text(json.dumps({
        'bos_token': '<s>', 'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<PAD>'},
        indent=2))


RESERVED_TOKEN = '<unused_{}>'


def build_instruction_tokenizer(instructions: list[str], vocab_size: int,
                                num_reserved: int) -> Tokenizer:
    """A BPE tokenizer learned from the prompts of ``instructions`` only (``build_text_
    tokenizer`` on OpenVLA's prompts)."""
    if not instructions:
        raise ValueError('instructions: expected at least one instruction')
    return build_text_tokenizer([format_prompt(text.strip()) for text in instructions],
                                vocab_size, num_reserved)


def build_text_tokenizer(texts: list[str], vocab_size: int, num_reserved: int) -> Tokenizer:
    """A BPE tokenizer learned from ``texts`` only, then padded with ``<unused_k>``
    placeholder ids to exactly ``vocab_size`` ids, then ``<PAD>`` at ``vocab_size``.

    The last ``num_reserved`` ids must be placeholders: an OpenVLA-layout model reads them as
    its action bins (OpenVLA overwrites Llama's least-used ids the same way), so no learned
    text piece may live there. Raises ValueError when the learned vocabulary is too large.
    """
    if not texts:
        raise ValueError('texts: expected at least one text')
    alphabet = sorted(set(''.join(texts).replace(' ', SPACE_PIECE)) | {SPACE_PIECE})
    max_learned = vocab_size - num_reserved
    tok = Tokenizer(models.BPE(unk_token='<unk>', fuse_unk=True, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_PIECE,
                                                 prepend_scheme='first')
    tok.decoder = decoders.Metaspace(replacement=SPACE_PIECE, prepend_scheme='first')
    trainer = trainers.BpeTrainer(vocab_size=max_learned, min_frequency=1,
                                  special_tokens=['<unk>', '<s>', '</s>'],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    num_learned = tok.get_vocab_size()
    if num_learned > max_learned:
        raise ValueError(f'tokenizer learned {num_learned} ids; at most {max_learned} fit '
                         f'below the {num_reserved} reserved ids')
    tok.add_tokens([RESERVED_TOKEN.format(i) for i in range(vocab_size - num_learned)])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f'tokenizer has {tok.get_vocab_size()} ids, wanted {vocab_size}')
    tok.post_processor = processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', 1)])
    tok.add_special_tokens([PAD_TOKEN])
    return tok
