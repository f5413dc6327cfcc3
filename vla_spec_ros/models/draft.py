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
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

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
        """Hugging Face Llama config keys (what EAGLE and Spec-VLA ship)."""
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


def save_draft(head: EagleDraftHead, folder: str | os.PathLike) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (keys ``fc.*``, ``layers.*``)."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to('cpu').contiguous() for k, v in head.state_dict().items()}
    dtype_name = str(head.fc.weight.dtype).replace('torch.', '')
    save_file(state, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    (folder / 'config.json').write_text(json.dumps(head.cfg.to_json(dtype_name), indent=2))
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


def load_draft(folder: str | os.PathLike, verifier_model, dtype: torch.dtype | None = None,
               device=None) -> EagleDraftHead:
    """Load a draft folder onto ``verifier_model`` (an ``OpenVLA`` or ``LlamaForCausalLM``).

    ``config.json`` is optional (absent: the verifier's layer shape); every ``fc.*`` /
    ``layers.*`` key must be present with the expected shape, anything else except the
    unused keys above is an error naming the key and file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'draft folder {folder} does not exist')
    lm = _language_model(verifier_model)
    ref = lm.lm_head.weight
    dtype = dtype or ref.dtype
    device = device or ref.device
    config_file = folder / 'config.json'
    if config_file.is_file():
        try:
            raw = json.loads(config_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f'{config_file}: not valid JSON ({exc})') from exc
        cfg = DraftConfig.from_json(raw, str(config_file), lm.cfg)
    else:
        cfg = DraftConfig.from_verifier(lm.cfg)
    if cfg.hidden_size != lm.cfg.hidden_size:
        raise CheckpointError(f'{config_file}: hidden_size {cfg.hidden_size} != verifier '
                              f'hidden_size {lm.cfg.hidden_size}')
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
           'RANDOM_DRAFT', 'CHECKPOINT_DRAFT', 'DEFAULT_DRAFT_SUBFOLDER']
