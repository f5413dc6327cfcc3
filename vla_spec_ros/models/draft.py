"""The EAGLE draft head (EAGLE-1/2 ``cnets1.Model``, Spec-VLA ``MMModel``) and its checkpoints.

Follows docs/speculation.md, Draft head: the input at draft position p is
``fc(cat(e_{p+1}, f_p))`` (embedding first, ``fc`` with bias), followed by one Llama decoder
layer whose first layer has no input norm, and NO final norm; logits come from the VERIFIER's
``lm_head``. The token embedding and the lm_head are the verifier's own modules, shared by
reference: they are neither copied nor registered as draft parameters, so the head's state dict
holds only ``fc.*`` and ``layers.*`` (the EAGLE / Spec-VLA key names).

A draft folder holds ``config.json`` (Hugging Face Llama keys, as EAGLE's ``EConfig`` and
Spec-VLA's ``llama_2_chat_7B_config.json`` use) and ``model.safetensors``. Pickle weights
(``pytorch_model.bin``) are refused (S8). ``engine.draft_choice.load_draft_for`` turns an
``EngineConfig``'s ``draft_path`` into a ready ``Drafter`` for the engine.

A head only drafts well for the verifier it was trained against, and its shapes alone do not
say which one that was: ``save_draft`` records the verifier's fingerprint in config.json
(``verifier_fingerprint``: sampled values of the embedding and lm_head it shared), and
``load_draft`` refuses a head whose fingerprint, vocabulary or positions do not fit the
verifier it is loaded onto. A head without a fingerprint (EAGLE's, Spec-VLA's, ours from
before) is checked on vocabulary and positions only.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import LlamaConfig
from ..validation import require_int_fields
from .attention import KVCache, StepBatch
from .weights import CheckpointError, _check_safetensors_file, load_state_dict, weight_files
from .layers import PLAIN, LayerKernels, LlamaDecoderLayer
from .rope import RopeRows, RopeTables

RANDOM_DRAFT = 'random'         # draft_path value for a seeded random (deliberately poor) head
CHECKPOINT_DRAFT = 'checkpoint'  # draft_path value for the checkpoint's own draft/ folder
DEFAULT_DRAFT_SUBFOLDER = 'draft'
# Keys EAGLE / Spec-VLA checkpoints may carry that the head does not use: their own copy of the
# token embedding (replaced by the verifier's at load, as Spec-VLA does) and old HF RoPE buffers.
EMBED_KEY = 'embed_tokens.weight'
_ROTARY_SUFFIX = '.self_attn.rotary_emb.inv_freq'
# config.json key of the verifier's fingerprint (``verifier_fingerprint``), and its contract:
# FINGERPRINT_SAMPLES values of each shared matrix at fixed (row, column) places. The same
# weights loaded in another dtype (bf16 rounds by at most 2**-8 of each value; FP8 never
# touches the embedding or the lm_head) stay well within FINGERPRINT_TOLERANCE, in relative
# L2 distance; another model's weights are at a distance of order 1.
FINGERPRINT_KEY = 'verifier_fingerprint'
FINGERPRINT_MATRICES = ('embed_tokens', 'lm_head')
FINGERPRINT_SAMPLES = 64
FINGERPRINT_TOLERANCE = 0.02


@dataclass(frozen=True)
class DraftConfig:
    """Shape of a draft head; by default that of the verifier's decoder layers."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    num_layers: int = 1

    def __post_init__(self):
        require_int_fields(self, ('hidden_size', 'num_heads', 'num_kv_heads',
                                  'intermediate_size', 'vocab_size',
                                  'max_position_embeddings', 'num_layers'), minimum=1)
        # Remaining checks (head dims, GQA, eps, theta) are LlamaConfig's own.
        self.to_llama_config()

    @classmethod
    def from_verifier(cls, llm: LlamaConfig, num_layers: int = 1) -> 'DraftConfig':
        return cls(hidden_size=llm.hidden_size, num_heads=llm.num_heads,
                   num_kv_heads=llm.num_kv_heads, intermediate_size=llm.intermediate_size,
                   rms_norm_eps=llm.rms_norm_eps, rope_theta=llm.rope_theta,
                   vocab_size=llm.vocab_size,
                   max_position_embeddings=llm.max_position_embeddings, num_layers=num_layers)

    def to_llama_config(self) -> LlamaConfig:
        return LlamaConfig(hidden_size=self.hidden_size, num_layers=self.num_layers,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                           intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
                           rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
                           max_position_embeddings=self.max_position_embeddings)

    def to_json(self, torch_dtype: str = 'float32') -> dict:
        """Hugging Face Llama config keys (what EAGLE and Spec-VLA ship); ``save_draft`` adds
        the verifier's fingerprint."""
        return {'architectures': ['EagleDraftHead'], 'model_type': 'llama',
                'hidden_act': 'silu', 'hidden_size': self.hidden_size,
                'num_attention_heads': self.num_heads,
                'num_key_value_heads': self.num_kv_heads,
                'intermediate_size': self.intermediate_size, 'rms_norm_eps': self.rms_norm_eps,
                'rope_theta': self.rope_theta, 'rope_scaling': None,
                'vocab_size': self.vocab_size,
                'max_position_embeddings': self.max_position_embeddings,
                'num_hidden_layers': self.num_layers, 'torch_dtype': torch_dtype}

    @classmethod
    def from_json(cls, data: dict, source: str, verifier: LlamaConfig) -> 'DraftConfig':
        """Read HF Llama keys; keys EAGLE's EConfig omits fall back to the verifier's values.

        EAGLE's config has no ``rope_theta`` and its RoPE uses base 10000 (reference §1), so a
        missing ``rope_theta`` means 10000.0, not the verifier's value.
        """
        if data.get('rope_scaling') not in (None, {}):
            raise CheckpointError(f'{source}: rope_scaling {data["rope_scaling"]!r} is not '
                                  'supported (EAGLE drafts use plain RoPE)')
        if data.get('hidden_act', 'silu') != 'silu':
            raise CheckpointError(f'{source}: hidden_act {data["hidden_act"]!r} is not "silu"')
        num_heads = data.get('num_attention_heads', verifier.num_heads)
        try:
            return cls(
                hidden_size=int(data.get('hidden_size', verifier.hidden_size)),
                num_heads=int(num_heads),
                num_kv_heads=int(data.get('num_key_value_heads') or num_heads),
                intermediate_size=int(data.get('intermediate_size',
                                               verifier.intermediate_size)),
                rms_norm_eps=float(data.get('rms_norm_eps', verifier.rms_norm_eps)),
                rope_theta=float(data.get('rope_theta') or 10000.0),
                vocab_size=int(data.get('vocab_size', verifier.vocab_size)),
                max_position_embeddings=int(data.get('max_position_embeddings',
                                                     verifier.max_position_embeddings)),
                num_layers=int(data.get('num_hidden_layers', 1)))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f'{source}: {exc}') from exc


class EagleDraftHead(nn.Module):
    """fc(cat(embedding, feature)) -> decoder layer(s) -> draft feature; logits via lm_head.

    ``embed_tokens`` and ``lm_head`` are the verifier's modules, held in a plain tuple so that
    they are not registered: ``parameters()`` / ``state_dict()`` cover ``fc`` and ``layers``
    only, and moving or training the head never touches the verifier.
    """

    def __init__(self, cfg: DraftConfig, embed_tokens: nn.Module, lm_head: nn.Module,
                 token_embeddings=None):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        llama_cfg = cfg.to_llama_config()
        self.fc = nn.Linear(2 * h, h, bias=True)
        # EAGLE: layer 0 reads the fc output without an input norm; deeper layers (if any)
        # are ordinary pre-norm Llama layers.
        self.layers = nn.ModuleList(LlamaDecoderLayer(llama_cfg, has_input_norm=i > 0)
                                    for i in range(cfg.num_layers))
        # ``token_embeddings``: the verifier's own embedding function (``Decoder``; Gemma scales
        # the table's rows by sqrt(width)); None: the table's rows as they are (training).
        self._shared = (embed_tokens, lm_head, token_embeddings)
        self._rope = RopeTables(llama_cfg)

    @property
    def embed_tokens(self) -> nn.Module:
        return self._shared[0]

    @property
    def lm_head(self) -> nn.Module:
        return self._shared[1]

    def rope(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables (max_position_embeddings, head_dim), cached per (dtype, device)."""
        return self._rope.get(dtype, device)

    def new_kv_cache(self, num_slots: int) -> KVCache:
        return KVCache.for_config(self.cfg.to_llama_config(), num_slots, self.fc.weight)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(T,) ids -> (T, H) verifier token embeddings (what the verifier itself feeds)."""
        if self._shared[2] is not None:
            return self._shared[2](token_ids)
        return self.embed_tokens.forward(token_ids)

    def forward(self, inputs_embeds: torch.Tensor, features: torch.Tensor, batch: StepBatch,
                cache: KVCache, kernels: LayerKernels = PLAIN) -> torch.Tensor:
        """inputs_embeds (T, H) = e_{p+1}, features (T, H) = f_p -> draft features (T, H).

        The output at position p is the draft's estimate of f_{p+1}. K/V go to
        ``batch.slot_mapping`` in ``cache``; attention follows ``batch.attn_mask``.
        """
        # Sub-modules through ``forward`` / ``F.linear`` (the same operations without
        # ``nn.Module.__call__``: models/layers.py).
        x = F.linear(torch.cat([inputs_embeds, features], dim=-1), self.fc.weight, self.fc.bias)
        rope = RopeRows.gather(self.rope(x.dtype, x.device), batch.positions)
        for i, layer in enumerate(self.layers):
            x = layer.forward(x, batch, rope, cache.k[i], cache.v[i], kernels)
        return x            # no final norm (EAGLE): features are already normalised

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(T, H) draft features -> (T, vocab) through the verifier's lm_head."""
        return self.lm_head.forward(hidden)


def _language_model(verifier):
    """Accept an ``OpenVLA`` or its ``LlamaForCausalLM``."""
    return getattr(verifier, 'language_model', verifier)


def new_draft_head(verifier, cfg: DraftConfig | None = None, seed: int | None = None,
                   dtype: torch.dtype | None = None, device=None) -> EagleDraftHead:
    """A randomly initialised head sharing ``verifier``'s embedding and lm_head (seeded).

    The initialisation keeps activations well scaled (normal(0, fan_in^-1/2) matrices, unit
    norm gains); untrained it is a deliberately poor draft.
    """
    lm = _language_model(verifier)
    cfg = cfg or DraftConfig.from_verifier(lm.cfg)
    ref = lm.lm_head.weight
    head = EagleDraftHead(cfg, lm.model.embed_tokens, lm.lm_head,
                          getattr(lm, 'token_embeddings', None))
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 1 and name.endswith('layernorm.weight'):
                p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)
    return head.to(device=device or ref.device, dtype=dtype or ref.dtype).eval()


def verifier_fingerprint(embed_tokens: nn.Module, lm_head: nn.Module) -> dict:
    """What identifies the verifier a head shares ``embed_tokens`` and ``lm_head`` with:
    ``FINGERPRINT_SAMPLES`` values of each matrix (rows spread over the vocabulary, columns
    spread over the width), in float64 rounded to 7 significant digits (config.json text)."""
    return {name: _sampled_values(module.weight)
            for name, module in zip(FINGERPRINT_MATRICES, (embed_tokens, lm_head))}


def _sampled_values(weight: torch.Tensor) -> list[float]:
    rows, cols = weight.shape
    row = torch.linspace(0, rows - 1, FINGERPRINT_SAMPLES).round().long()
    # A prime stride walks every column of a power-of-two width before repeating one.
    col = torch.arange(FINGERPRINT_SAMPLES) * 97 % cols
    values = weight.detach()[row.to(weight.device), col.to(weight.device)]
    return [float(f'{v:.7g}') for v in values.to('cpu', torch.float64).tolist()]


def save_draft(head: EagleDraftHead, folder: str | os.PathLike) -> Path:
    """Write ``config.json`` (with the fingerprint of the verifier whose embedding and lm_head
    ``head`` shares) + ``model.safetensors`` (keys ``fc.*``, ``layers.*``)."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to('cpu').contiguous() for k, v in head.state_dict().items()}
    dtype_name = str(head.fc.weight.dtype).replace('torch.', '')
    save_file(state, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    config = {**head.cfg.to_json(dtype_name),
              FINGERPRINT_KEY: verifier_fingerprint(head.embed_tokens, head.lm_head)}
    (folder / 'config.json').write_text(json.dumps(config, indent=2))
    return folder


def _check_embed_key(mapping: dict[str, Path], verifier_cfg: LlamaConfig) -> None:
    """A checkpoint's own embedding is unused, but must fit the verifier it is loaded onto.

    Its row count may be below the verifier's vocab (Spec-VLA ships a 32000-row embedding for
    OpenVLA's padded 32064-row vocab); the width must equal the verifier's hidden size.
    """
    path = mapping[EMBED_KEY]
    shape = tuple(_check_safetensors_file(path)[EMBED_KEY]['shape'])
    if (len(shape) != 2 or shape[1] != verifier_cfg.hidden_size
            or shape[0] > verifier_cfg.vocab_size):
        raise CheckpointError(f'{path}: key {EMBED_KEY} has shape {shape}, incompatible with '
                              f'the verifier embedding ({verifier_cfg.vocab_size}, '
                              f'{verifier_cfg.hidden_size})')


def _check_fits_verifier(cfg: DraftConfig, verifier_model, source: str) -> None:
    """The head's shape must be the verifier's: its width, its vocabulary (or the verifier's
    text vocabulary without its padding rows: Spec-VLA's 32000 ids for OpenVLA's 32064) and
    at least the positions a frame of the verifier may use (the engine admits frames up to
    the verifier's ``max_position_embeddings``; the draft sits at the same positions)."""
    llm = _language_model(verifier_model).cfg
    if cfg.hidden_size != llm.hidden_size:
        raise CheckpointError(f'{source}: hidden_size {cfg.hidden_size} != verifier '
                              f'hidden_size {llm.hidden_size}')
    text_vocab = getattr(getattr(verifier_model, 'cfg', None), 'text_vocab_size', None)
    vocabularies = sorted({llm.vocab_size, text_vocab or llm.vocab_size})
    if cfg.vocab_size not in vocabularies:
        raise CheckpointError(f'{source}: vocab_size {cfg.vocab_size} != verifier vocab_size '
                              f'{" or ".join(map(str, vocabularies))}: this head was made for '
                              'another model')
    if cfg.max_position_embeddings < llm.max_position_embeddings:
        raise CheckpointError(f'{source}: max_position_embeddings '
                              f'{cfg.max_position_embeddings} < the verifier\'s '
                              f'{llm.max_position_embeddings} (the draft sits at the '
                              'verifier\'s positions)')


def _check_fingerprint(raw: dict, lm, source: str, verifier_name: str) -> None:
    """A head saved with a fingerprint loads only onto the verifier it was trained for; one
    without (EAGLE's, Spec-VLA's, older ones) is not checked here."""
    if FINGERPRINT_KEY not in raw:
        return
    saved = raw[FINGERPRINT_KEY]
    current = verifier_fingerprint(lm.model.embed_tokens, lm.lm_head)
    for name in FINGERPRINT_MATRICES:
        values = saved.get(name) if isinstance(saved, dict) else None
        if not (isinstance(values, list) and len(values) == FINGERPRINT_SAMPLES
                and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                        for v in values)):
            raise CheckpointError(f'{source}: {FINGERPRINT_KEY}.{name} must be a list of '
                                  f'{FINGERPRINT_SAMPLES} numbers (written by save_draft)')
        distance = _relative_distance(np.asarray(values, np.float64),
                                      np.asarray(current[name], np.float64))
        if not distance <= FINGERPRINT_TOLERANCE:
            raise CheckpointError(
                f'{source}: this draft head was trained for another verifier than '
                f'{verifier_name} (its {FINGERPRINT_KEY}.{name} differs from that model\'s '
                f'{name} by {distance:.3g}, relative; at most {FINGERPRINT_TOLERANCE} is the '
                'same model); train a head for this model (vla-spec train-draft)')


def _relative_distance(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    return float(np.linalg.norm(a - b)) / scale if scale > 0 else 0.0


def _read_draft_config(folder: Path, lm) -> tuple[DraftConfig, dict, str]:
    """(config, config.json's data, the name errors give) of a draft folder; no config.json:
    the verifier's layer shape and no fingerprint."""
    config_file = folder / 'config.json'
    if not config_file.is_file():
        return DraftConfig.from_verifier(lm.cfg), {}, str(folder)
    try:
        raw = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f'{config_file}: not valid JSON ({exc})') from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f'{config_file}: expected a JSON object, got '
                              f'{type(raw).__name__}')
    return DraftConfig.from_json(raw, str(config_file), lm.cfg), raw, str(config_file)


def load_draft(folder: str | os.PathLike, verifier_model, dtype: torch.dtype | None = None,
               device=None, verifier_name: str | None = None) -> EagleDraftHead:
    """Load a draft folder onto ``verifier_model`` (an ``OpenVLA`` or ``LlamaForCausalLM``).

    ``config.json`` is optional (absent: the verifier's layer shape); the head must fit the
    verifier (width, vocabulary, positions) and, when config.json has a fingerprint, have
    been trained for it (``verifier_name``: how errors name the verifier, e.g. its
    checkpoint folder). Every ``fc.*`` / ``layers.*`` key must be present with the expected
    shape, anything else except the unused keys above is an error naming the key and file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'draft folder {folder} does not exist')
    lm = _language_model(verifier_model)
    ref = lm.lm_head.weight
    dtype = dtype or ref.dtype
    device = device or ref.device
    cfg, raw, source = _read_draft_config(folder, lm)
    _check_fits_verifier(cfg, verifier_model, source)
    _check_fingerprint(raw, lm, source, verifier_name or 'the model it is loaded onto')
    with torch.device('meta'):
        head = EagleDraftHead(cfg, lm.model.embed_tokens, lm.lm_head,
                              getattr(lm, 'token_embeddings', None))
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    mapping = weight_files(folder)
    allowed_unused = {k for k in mapping if k == EMBED_KEY or k.endswith(_ROTARY_SUFFIX)}
    if EMBED_KEY in mapping:
        _check_embed_key(mapping, lm.cfg)
    state = load_state_dict(folder, expected, allowed_unused, dtype, device)
    head.load_state_dict(state, strict=True, assign=True)
    return head.eval()


__all__ = ['DraftConfig', 'EagleDraftHead', 'new_draft_head', 'save_draft', 'load_draft',
           'verifier_fingerprint', 'RANDOM_DRAFT', 'CHECKPOINT_DRAFT',
           'DEFAULT_DRAFT_SUBFOLDER', 'FINGERPRINT_KEY']
