"""FAST's action tokenizer: a normalised chunk <-> integer DCT coefficients <-> BPE ids.

FAST (Pertsch et al., "FAST: Efficient Action Tokenization for Vision-Language-Action Models",
2025; the ``physical-intelligence/fast`` processor that openpi and LeRobot load) compresses an
action chunk of H control steps x D dimensions, already normalised to [-1, 1]:

1. DCT-II with orthonormal scaling along time, per dimension (what ``scipy.fft.dct(type=2,
   norm='ortho', axis=0)`` computes; here the matrix product of dct.py, no scipy);
2. x ``scale`` (10 in the paper), rounded half to even (``np.rint``) to integers q;
3. flattened frequency-major: coefficient 0 of every dimension first, then coefficient 1, ...
   (the C-order flatten of the (H, D) coefficient array);
4. each q becomes one character, ``chr(q - min_token)`` (``min_token`` <= every q the fit saw,
   so the code points are >= 0);
5. the string is split by a byte-level BPE (HF ``tokenizers``, ``tokenizer.json``) into ids
   0 .. n-1 (the "FAST ids"; a model family maps them into its own vocabulary).

Decoding inverts each step on the whole id sequence: BPE-decode to the string, ``ord(c) +
min_token``, reshape to (H, D), / ``scale``, orthonormal IDCT. Rounding is the only loss: each
coefficient is off by at most 0.5 / scale, and the orthonormal IDCT preserves the L2 norm, so
per dimension ||chunk - decoded||_2 <= 0.5 sqrt(H) / scale, and over the chunk
<= 0.5 sqrt(H D) / scale. A sequence that does not decode to exactly H x D integers (or whose
bytes are not whole UTF-8 characters) is refused with ``FastDecodeError``: never padded,
truncated or replaced by zeros (LeRobot pads or truncates, the published processor returns
zeros; both would hand a robot an action nobody decided).

Fitting (``fit_fast_tokenizer``) follows the published algorithm: ``min_token`` / the integer
range from the data, a ``ByteLevelBPETokenizer`` pipeline (ByteLevel pre-tokenizer with the
GPT-2 split, no prefix space; ByteLevel decoder), ``BpeTrainer(min_frequency=2,
max_token_length=10000, no special tokens)`` with ``chr(0 .. max - min)`` as initial alphabet.
One deliberate addition: the byte-level characters of those code points join the alphabet, so
that every integer in the fitted range is encodable (the published alphabet holds raw code
points, and the byte-level pipeline never produces those >= 128, so a coefficient whose bytes
never occurred in the data had no token and was dropped silently by the BPE). ``encode``
checks that the ids decode back to the coefficients, whatever tokenizer.json was loaded.

Files: ``tokenizer.json`` (HF tokenizers format; any tokenizer.json of this pipeline loads)
and ``fast_config.json`` (``FastParams``). A folder with the published processor's
``processor_config.json`` (keys ``scale``, ``min_token``, ``time_horizon``, ``action_dim``)
loads too; H and D then come from the caller when the file leaves them null.

Pure numpy plus ``tokenizers``; no torch, no scipy (the package does not require it).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..validation import check_int, check_number
from .dct import dct, idct

TOKENIZER_FILE = 'tokenizer.json'
FAST_CONFIG_FILE = 'fast_config.json'
PUBLISHED_CONFIG_FILE = 'processor_config.json'   # the published processor's parameters

MAX_CODE_POINT = 0x10FFFF           # chr()'s limit
SURROGATES = (0xD800, 0xDFFF)       # code points UTF-8 cannot carry
REPLACEMENT_CHAR = '\ufffd'         # what the byte-level decoder makes of broken UTF-8


class FastDecodeError(ValueError):
    """A FAST id sequence that does not decode to one (H, D) chunk (the reason says why)."""


@dataclass(frozen=True)
class FastParams:
    """The FAST transform's parameters (``fast_config.json``); validated at construction."""

    scale: float                # DCT coefficients are multiplied by this before rounding
    min_token: int              # q -> chr(q - min_token): the smallest coefficient encodable
    action_horizon: int         # H: control steps per chunk
    action_dim: int             # D: action dimensions
    vocab_size: int             # the BPE vocabulary size asked for at fitting

    def __post_init__(self):
        check_number('scale', self.scale, above=0.0)
        check_int('min_token', self.min_token)
        for name in ('action_horizon', 'action_dim', 'vocab_size'):
            check_int(name, getattr(self, name), minimum=1)

    @property
    def num_coefficients(self) -> int:
        return self.action_horizon * self.action_dim

    @property
    def max_error_l2(self) -> float:
        """Round-trip bound on ||chunk - decoded||_2 over the whole (H, D) chunk: every
        coefficient is rounded by at most 0.5 / scale, and the orthonormal IDCT keeps the L2
        norm of that error."""
        return 0.5 * math.sqrt(self.num_coefficients) / self.scale


# ---- the integer transform (steps 1-4 and their inverse) ----------------------------------

def chunk_to_coefficients(chunk: np.ndarray, scale: float) -> np.ndarray:
    """(H, D) normalised chunk -> (H * D,) int64 coefficients, frequency-major."""
    chunk = np.asarray(chunk, dtype=np.float64)
    if chunk.ndim != 2:
        raise ValueError(f'chunk: expected (H, D), got shape {chunk.shape}')
    if not np.isfinite(chunk).all():
        raise ValueError('chunk: non-finite values')
    coefficients = dct(chunk) * scale                                    # (H, D)
    return np.rint(coefficients).astype(np.int64).reshape(-1)            # k-major flatten


def coefficients_to_chunk(coefficients: Sequence[int], action_horizon: int, action_dim: int,
                          scale: float) -> np.ndarray:
    """(H * D,) integer coefficients, frequency-major -> (H, D) normalised chunk."""
    q = np.asarray(coefficients, dtype=np.float64)
    if q.shape != (action_horizon * action_dim,):
        raise ValueError(f'coefficients: expected {action_horizon * action_dim}, got '
                         f'shape {q.shape}')
    return idct(q.reshape(action_horizon, action_dim) / scale)


def coefficients_to_text(coefficients: Sequence[int], min_token: int) -> str:
    """One character per coefficient: chr(q - min_token); ValueError for a q outside what a
    character can carry (below min_token, past U+10FFFF, a surrogate)."""
    codes = np.asarray(coefficients, dtype=np.int64) - int(min_token)
    bad = (codes < 0) | (codes > MAX_CODE_POINT) | \
        ((codes >= SURROGATES[0]) & (codes <= SURROGATES[1]))
    if bad.any():
        values = sorted({int(q) for q in np.asarray(coefficients)[bad]})
        raise ValueError(f'coefficient(s) {values[:8]} cannot be encoded with min_token '
                         f'{min_token} (below it, or past the characters UTF-8 carries)')
    return ''.join(map(chr, codes.tolist()))


def text_to_coefficients(text: str, min_token: int) -> np.ndarray:
    """Inverse of ``coefficients_to_text``: (len(text),) int64."""
    return np.fromiter((ord(c) for c in text), dtype=np.int64, count=len(text)) + int(min_token)


# ---- the BPE ------------------------------------------------------------------------------

class FastTokenizer:
    """A fitted or loaded FAST tokenizer: ``FastParams`` + a ``tokenizers.Tokenizer``."""

    def __init__(self, bpe, params: FastParams):
        self.bpe = bpe                      # tokenizers.Tokenizer (byte-level BPE)
        self.params = params
        self.num_ids = int(bpe.get_vocab_size())    # FAST ids are 0 .. num_ids - 1
        if self.num_ids < 1:
            raise ValueError('tokenizer.json: empty vocabulary')

    def encode(self, chunk: np.ndarray) -> list[int]:
        """(H, D) normalised chunk -> FAST ids. ValueError for a wrong shape, a coefficient
        below ``min_token``, or ids that do not decode back to the coefficients (a character
        the loaded vocabulary cannot spell)."""
        p = self.params
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.shape != (p.action_horizon, p.action_dim):
            raise ValueError(f'chunk: expected ({p.action_horizon}, {p.action_dim}), got '
                             f'{chunk.shape}')
        text = coefficients_to_text(chunk_to_coefficients(chunk, p.scale), p.min_token)
        ids = list(self.bpe.encode(text).ids)
        if self.bpe.decode(ids) != text:
            raise ValueError('chunk: its coefficients are not spelled exactly by this '
                             'tokenizer\'s vocabulary (a character outside the fitted range)')
        return ids

    def decode_coefficients(self, ids: Sequence[int]) -> np.ndarray:
        """FAST ids -> (H * D,) int64 coefficients; ``FastDecodeError`` unless the whole
        sequence decodes to exactly H * D whole characters."""
        p = self.params
        ids = [int(i) for i in ids]
        if not ids:
            raise FastDecodeError('no FAST tokens')
        outside = [i for i in ids if not 0 <= i < self.num_ids]
        if outside:
            raise FastDecodeError(f'FAST id(s) {outside[:8]} outside the vocabulary '
                                  f'[0, {self.num_ids})')
        text = self.bpe.decode(ids)
        # U+FFFD is where the byte-level decoder met bytes that are not whole characters (a
        # coefficient 65533 + min_token is far past any normalised chunk's).
        if REPLACEMENT_CHAR in text:
            raise FastDecodeError('the FAST tokens\' bytes are not whole UTF-8 characters')
        if len(text) != p.num_coefficients:
            raise FastDecodeError(f'the FAST tokens decode to {len(text)} coefficients, a '
                                  f'({p.action_horizon}, {p.action_dim}) chunk needs '
                                  f'{p.num_coefficients}')
        return text_to_coefficients(text, p.min_token)

    def decode(self, ids: Sequence[int]) -> np.ndarray:
        """FAST ids -> (H, D) normalised chunk (``FastDecodeError`` as above)."""
        p = self.params
        return coefficients_to_chunk(self.decode_coefficients(ids), p.action_horizon,
                                     p.action_dim, p.scale)

    def token_text(self, fast_id: int) -> str:
        """What one FAST id decodes to on its own (REPLACEMENT_CHAR for a partial
        character)."""
        return self.bpe.decode([int(fast_id)])

    def save(self, folder) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.bpe.save(str(folder / TOKENIZER_FILE))
        params = {k: (float(v) if k == 'scale' else int(v))
                  for k, v in asdict(self.params).items()}
        (folder / FAST_CONFIG_FILE).write_text(json.dumps(params, indent=2, sort_keys=True)
                                               + '\n')
        return folder

    @classmethod
    def load(cls, folder, *, action_horizon: int | None = None,
             action_dim: int | None = None) -> 'FastTokenizer':
        """tokenizer.json + fast_config.json (or the published processor_config.json) from
        ``folder``. ``action_horizon`` / ``action_dim`` fill what the file leaves null and
        must agree with what it states."""
        from tokenizers import Tokenizer
        folder = Path(folder)
        params = _read_params(folder)
        for name, given in (('action_horizon', action_horizon), ('action_dim', action_dim)):
            stated = params.get(name)
            if given is not None and stated is not None and int(given) != int(stated):
                raise ValueError(f'{name}: {given} given, {folder} states {stated}')
            if stated is None:
                if given is None:
                    raise ValueError(f'{name}: {folder} does not state it; pass it')
                params[name] = int(given)
        return cls(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), FastParams(**params))


def _read_params(folder: Path) -> dict:
    """FastParams' fields from fast_config.json (unknown keys fail), else from the published
    processor_config.json (its other keys, e.g. processor_class, are ignored)."""
    ours, published = folder / FAST_CONFIG_FILE, folder / PUBLISHED_CONFIG_FILE
    fields = ('scale', 'min_token', 'action_horizon', 'action_dim', 'vocab_size')
    if ours.is_file():
        raw = json.loads(ours.read_text())
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise ValueError(f'{ours}: unknown key(s) {unknown}; expected {list(fields)}')
        return {k: raw.get(k) for k in fields}
    if published.is_file():
        raw = json.loads(published.read_text())
        return {'scale': raw.get('scale'), 'min_token': raw.get('min_token'),
                'action_horizon': raw.get('time_horizon'), 'action_dim': raw.get('action_dim'),
                'vocab_size': raw.get('vocab_size')}
    raise FileNotFoundError(f'{folder}: neither {FAST_CONFIG_FILE} nor {PUBLISHED_CONFIG_FILE}')


def _byte_level_chars(text: str) -> list[str]:
    """The byte-level pre-tokenizer's characters for the UTF-8 bytes of ``text``."""
    from tokenizers import pre_tokenizers
    mapped = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False) \
        .pre_tokenize_str(text)
    return sorted({c for piece, _ in mapped for c in piece})


def fit_fast_tokenizer(action_chunks, *, vocab_size: int = 2048, scale: float = 10.0,
                       min_frequency: int = 2, max_token_length: int = 10000,
                       folder=None) -> FastTokenizer:
    """Fit FAST's BPE on normalised chunks (N, H, D) (see the module docstring); saved to
    ``folder`` when given. Deterministic for the same chunks and arguments."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    chunks = np.asarray(action_chunks, dtype=np.float64)
    if chunks.ndim != 3 or 0 in chunks.shape:
        raise ValueError(f'action_chunks: expected (N, H, D) with N, H, D >= 1, got '
                         f'{chunks.shape}')
    if not np.isfinite(chunks).all():
        raise ValueError('action_chunks: non-finite values')
    check_int('vocab_size', vocab_size, minimum=1)
    check_int('min_frequency', min_frequency, minimum=1)
    scale = check_number('scale', scale, above=0.0)
    coefficients = np.stack([chunk_to_coefficients(c, scale) for c in chunks])      # (N, H*D)
    min_token, max_token = int(coefficients.min()), int(coefficients.max())
    if max_token - min_token > vocab_size:
        raise ValueError(f'vocab_size: {vocab_size} is smaller than the integer range '
                         f'{max_token - min_token} of the coefficients (lower the scale)')
    texts = [coefficients_to_text(row, min_token) for row in coefficients]

    bpe = Tokenizer(models.BPE())           # ByteLevelBPETokenizer()'s pipeline
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    raw_alphabet = ''.join(chr(i) for i in range(max_token - min_token + 1))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=[], max_token_length=max_token_length,
        initial_alphabet=sorted(set(raw_alphabet) | set(_byte_level_chars(raw_alphabet))))
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = FastTokenizer(bpe, FastParams(scale, min_token, chunks.shape[1],
                                              chunks.shape[2], vocab_size))
    if folder is not None:
        tokenizer.save(folder)
    return tokenizer


__all__ = ['FAST_CONFIG_FILE', 'TOKENIZER_FILE', 'FastDecodeError', 'FastParams',
           'FastTokenizer', 'chunk_to_coefficients', 'coefficients_to_chunk',
           'coefficients_to_text', 'fit_fast_tokenizer', 'text_to_coefficients']
