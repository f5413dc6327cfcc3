"""Action codecs shared by model families (action_codec.ActionCodec implementations).

``fast``: FAST tokens (DCT + BPE, pi0-FAST), ``fast_tokenizer`` its transform and BPE,
``dct`` the orthonormal DCT it uses (numpy; the package does not require scipy),
``fast_synthetic`` a small tokenizer fitted on synthetic chunks for tests and tiny checkpoints
(docs/fast.md). OpenVLA's bins stay in ``actions.ActionTokenizer``.
"""
from .fast import FastActionCodec
from .fast_tokenizer import FastDecodeError, FastParams, FastTokenizer, fit_fast_tokenizer

__all__ = ['FastActionCodec', 'FastDecodeError', 'FastParams', 'FastTokenizer',
           'fit_fast_tokenizer']
