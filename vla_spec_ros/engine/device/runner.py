"""Model runner: the device side of the verifier.

``ModelRunner`` owns the loaded model, the prompt builder, dtype/device, the fused-kernel
choice and the vision towers (optionally graphed; side by side on a GPU); it knows nothing
about scheduling. It is typed against the model protocol (models/protocol.py) only: the
family's facts (width, vocabulary, positions, image slots, prefix attention rule), its
preprocessing, prompt and default codec come from the model and its ``PromptBuilder``; the
family's own config (``cfg``) is carried for callers that know the family, never read here.
``RingRunner`` (one per engine, made by ``ModelRunner.new_ring``) owns what a decoding strategy
drives step after step: the unified KV ring (allocated once, plus one scratch slot that padding
rows write to), the static input buffers and CUDA graphs of the packed verifier step
(``PackedForward``). A strategy hands it a host-side ``HostStep`` and gets back the greedy
tokens (the step's one device -> host read) and the hidden states (left on the device).

``ModelRunner.forward`` (dense ``StepBatch``, any cache) serves the plain AR reference.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ...action_codec import ActionCodec
from ...config import EngineConfig
from ...models.attention import KVCache, StepBatch
from ...models.fp8 import apply_weight_dtype
from ...models.layers import LayerKernels, fuse_projections
from ...models.protocol import PREFIX_ATTENTION, PromptBuilder, VLAModel
from ...image_check import ImageError, check_image
from .frame_upload import FrameUploader, device_ids
from .kernel_choice import select_layer_kernels, with_attention_backend
from .packed_forward import GraphedFunction, PackedForward
from ..result import Frame
from .step_inputs import HostStep

MAX_CACHED_INSTRUCTIONS = 32   # prompt ids kept by ``prompt_ids``


def _joined(parts: list) -> torch.Tensor:
    """Row blocks in order, concatenated only when there are several."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


TORCH_DTYPES = {'float32': torch.float32, 'float64': torch.float64,
                'bfloat16': torch.bfloat16, 'float16': torch.float16}


@dataclass
class PreparedPrompt:
    input_ids: list[int]            # the prompt builder's ids (BOS first)
    embeds: torch.Tensor            # (L, H): the family's prefill rows, L = prefix_len


class ModelRunner:
    def __init__(self, model: VLAModel, cfg, tokenizer: PromptBuilder,
                 engine_cfg: EngineConfig, codec: ActionCodec | None = None,
                 checkpoint_folder=None):
        self.model = model
        # Where the weights came from (None: built in memory); the drafter chosen by an
        # engine's draft_path "checkpoint" is looked up there.
        self.checkpoint_folder = checkpoint_folder
        # weight_dtype fp8: the decoder's projections quantised in place (models/fp8.py),
        # before the fusion below fuses them; runners sharing the model must agree.
        apply_weight_dtype(model.language_model, engine_cfg.weight_dtype,
                           TORCH_DTYPES[engine_cfg.dtype], torch.device(engine_cfg.device))
        if torch.device(engine_cfg.device).type == 'cuda':
            fuse_projections(model.language_model)  # q/k/v and gate/up: one product each
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.dtype = TORCH_DTYPES[engine_cfg.dtype]
        self.device = torch.device(engine_cfg.device)
        # How generated tokens become actions (action_codec.py); the family's by default.
        self.codec = codec if codec is not None else model.action_codec()
        if model.prefix_attention not in PREFIX_ATTENTION:
            raise ValueError(f'prefix_attention: {model.prefix_attention!r} not in '
                             f'{PREFIX_ATTENTION}')
        # Fused RoPE + KV write, norms and SwiGLU activation (``use_kernels``), passed per
        # forward, so runners sharing one model keep their own choice.
        self.kernels = select_layer_kernels(engine_cfg, self.device)
        self.use_cuda_graphs = engine_cfg.use_cuda_graphs   # EngineConfig: CUDA devices only
        action_ids = self.codec.action_token_range()
        if engine_cfg.restrict_to_action_tokens and action_ids is None:
            raise ValueError(f'restrict_to_action_tokens: the codec '
                             f'{type(self.codec).__name__} has no contiguous action-token range')
        self._action_mask = torch.full((model.vocab_size,), float('-inf'), dtype=self.dtype,
                                       device=self.device)
        if action_ids is not None:
            self._action_mask[action_ids[0]:action_ids[1] + 1] = 0
        # A variable-length frame must still end, and a codec whose frames carry text around
        # the action tokens (FAST: "Action: ", "|", EOS: ``text_tokens``) must still write it.
        for token in set(getattr(self.codec, 'text_tokens', ())) | (
                {self.codec.end_token} if self.codec.end_token is not None else set()):
            self._action_mask[token] = 0
        # The model family's fastest image path on this device (the same values): OpenVLA's
        # two towers side by side on a GPU, one after the other on a CPU.
        self.image_embeddings = model.image_embeddings_for(self.device)
        # One vision graph per number of images a frame carries (captured on first use).
        self._vision_graphs: dict[int, GraphedFunction] = {}
        self._frames = FrameUploader(self.device)
        # (instruction, state) -> prompt ids (``prompt_ids``; the tokenizer is this runner's)
        self._instruction_ids: OrderedDict[tuple, tuple[int, ...]] = OrderedDict()

    # ---- the model's facts (models/protocol.py) ----------------------------------------------

    @property
    def hidden_size(self) -> int:
        return self.model.hidden_size

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    @property
    def image_size(self) -> int:
        return self.model.image_size

    def num_bidirectional(self, prefix_len: int) -> int:
        """Rows of a ``prefix_len``-row prefill that every row of it reads (the model's
        prefix attention rule): all of them for a prefix-LM, none for a causal model."""
        return prefix_len if self.model.prefix_attention == 'bidirectional' else 0

    @property
    def max_action_tokens(self) -> int:
        """Most tokens one frame decodes (the codec's): what the ring, the draft lanes and a
        speculative prefill's chain are sized by."""
        return self.codec.max_tokens

    @property
    def lm(self):
        return self.model.language_model

    def validate_instruction(self, instruction: str) -> list[int]:
        """The instruction's prompt ids without a state (``prompt_ids``)."""
        return self.prompt_ids(instruction, None)

    def prompt_ids(self, instruction: str, state=None) -> list[int]:
        """The prompt ids of an instruction and state (a new list; ``PromptError`` for a bad
        one). A robot repeats its instruction frame after frame: the ids of the last
        ``MAX_CACHED_INSTRUCTIONS`` (instruction, state) pairs are kept, so tokenising costs
        once per instruction for a family whose prompt reads no state (a state changes every
        frame, and a family that reads one tokenises every frame)."""
        if not isinstance(instruction, str):
            return self.tokenizer.encode(instruction, state)       # refused there
        if state is None:
            key = (instruction, None)
        else:
            array = np.asarray(state)
            key = (instruction, array.dtype.str, array.shape, array.tobytes())
        ids = self._instruction_ids.get(key)
        if ids is None:
            ids = tuple(self.tokenizer.encode(instruction, state))   # raises for bad input
            if len(self._instruction_ids) >= MAX_CACHED_INSTRUCTIONS:
                self._instruction_ids.popitem(last=False)
            self._instruction_ids[key] = ids
        else:
            self._instruction_ids.move_to_end(key)
        return list(ids)

    def frame_prompt_ids(self, frame: Frame) -> list[int]:
        """``prompt_ids`` of a frame's instruction and (for a family that reads one) state."""
        return self.prompt_ids(frame.instruction, frame.state)

    def check_frame(self, frame: Frame) -> None:
        """The frame's images: 1 .. ``num_image_slots`` uint8 RGB arrays (``ImageError``
        otherwise); a state only for a family that reads one."""
        images = frame.images
        slots = self.model.num_image_slots
        if not 1 <= len(images) <= slots:
            raise ImageError(f'image: {len(images)} images for a model with {slots} image '
                             f'slot{"s" if slots > 1 else ""}')
        for image in images:
            check_image(image)
        if frame.state is not None and not self.model.uses_state:
            raise ValueError('state: this model\'s prompt reads no robot state')

    def prefix_len(self, input_ids: list[int], num_images: int = 1) -> int:
        return self.model.prefix_len(len(input_ids), num_images)

    def max_prefix_len(self, max_instruction_tokens: int) -> int:
        """Longest prefill an accepted frame can produce (every image slot filled)."""
        return self.model.prefix_len(self.tokenizer.max_prompt_len(max_instruction_tokens),
                                     self.model.num_image_slots)

    @torch.no_grad()
    def prepare_prompt(self, frame: Frame, engine_cfg: EngineConfig,
                       input_ids: list[int] | None = None) -> PreparedPrompt:
        """The frame's prompt embeddings, queued on the device. On a GPU, in the steady
        state, nothing here waits for the GPU (the uint8 frame goes up through a pinned
        buffer, preprocessing runs on the device, the instruction's ids are cached there), so
        the vision towers run while the host goes on planning the step. Waits remain the
        first time: a new instruction's ids, the first normalisation constants, the vision
        graph's capture."""
        ids = input_ids if input_ids is not None else self.frame_prompt_ids(frame)
        pixels = self.prepare_pixels(frame, engine_cfg)                 # (I, C, S, S)
        if self.use_cuda_graphs:
            graph = self._vision_graphs.get(pixels.shape[0])
            if graph is None:
                graph = self._vision_graphs[pixels.shape[0]] = GraphedFunction(
                    self._vision, self.device)
            patches = graph({'pixels': pixels})['patches'].clone()
        else:
            patches = self._vision({'pixels': pixels})['patches']      # (I * P, H)
        return PreparedPrompt(ids, self.model.prompt_embeddings(
            patches, device_ids(tuple(ids), self.device)))

    @torch.no_grad()
    def prepare_prompts(self, frames: Sequence[Frame], engine_cfg: EngineConfig,
                        input_ids: Sequence[list[int]]) -> list[PreparedPrompt]:
        """``prepare_prompt`` of several frames (one packed step's admitted frames). Eagerly
        the vision towers and the projector run once over the stacked frames: the same
        operations per frame in one batch, which a small model's step (bound by per-operation
        cost) pays about once (every frame's images stacked). With the vision graphs (captured
        per image count of one frame), one by one."""
        if len(frames) != len(input_ids):
            raise ValueError(f'input_ids: {len(input_ids)} lists for {len(frames)} frames')
        if len(frames) == 1 or self.use_cuda_graphs:
            return [self.prepare_prompt(f, engine_cfg, ids) for f, ids in zip(frames, input_ids)]
        per_frame = [self.prepare_pixels(f, engine_cfg) for f in frames]
        patches = self.image_embeddings(torch.cat(per_frame))               # (sum I, P, H)
        out, start = [], 0
        for pixels, ids in zip(per_frame, input_ids):
            rows = patches[start:start + pixels.shape[0]]
            start += pixels.shape[0]
            out.append(PreparedPrompt(ids, self.model.prompt_embeddings(
                rows.reshape(-1, rows.shape[-1]), device_ids(tuple(ids), self.device))))
        return out

    def prepare_pixels(self, frame: Frame, engine_cfg: EngineConfig) -> torch.Tensor:
        """The frame's (I, C, S, S) pixel values (one per image, slot order) in the model
        dtype, preprocessed by the family on the device after a uint8 upload
        (``FrameUploader``)."""
        return torch.stack([self.model.preprocess(
            self._frames.upload(check_image(image)), center_crop=engine_cfg.center_crop,
            rotate_180=engine_cfg.rotate_180) for image in frame.images]).to(self.dtype)

    def _vision(self, inputs: dict) -> dict:
        """(I, C, S, S) -> the (I * P, H) patches of one frame's images."""
        patches = self.image_embeddings(inputs['pixels'])
        return {'patches': patches.reshape(-1, patches.shape[-1])}

    def new_cache(self, num_slots: int) -> KVCache:
        return self.lm.new_kv_cache(num_slots)

    def kernels_for(self, config: EngineConfig) -> LayerKernels:
        """The kernels of one engine's forwards (its ring's and its drafter's): the runner's,
        plus the segment attention kernel with ``attention_backend: ring``."""
        return with_attention_backend(self.kernels, config, self.device)

    def new_ring(self, capacity: int, config: EngineConfig) -> 'RingRunner':
        return RingRunner(self, capacity, config.restrict_to_action_tokens,
                          is_dense=config.attention_backend == 'dense',
                          kernels=self.kernels_for(config))

    @torch.no_grad()
    def forward(self, embeds: torch.Tensor, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """(T, H) packed input embeddings -> final-normed hidden states (T, H)."""
        return self.lm.forward_hidden(embeds, batch, cache, self.kernels)

    @torch.no_grad()
    def greedy(self, hidden: torch.Tensor, restrict_to_action_tokens: bool) -> torch.Tensor:
        """(T, H) hidden -> (T,) argmax token ids (S1: over the full vocabulary by default)."""
        return self.greedy_rows(hidden, restrict_to_action_tokens)

    def greedy_rows(self, hidden: torch.Tensor, restrict_to_action_tokens: bool) -> torch.Tensor:
        """``greedy`` for callers already under inference mode (the packed step): the same
        operations without entering ``no_grad`` once more."""
        logits = self.lm.logits(hidden)
        if restrict_to_action_tokens:
            logits = logits + self._action_mask.to(logits.dtype)
        return logits.argmax(dim=-1)

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.token_embeddings(token_ids)


class RingRunner:
    """The verifier's packed step over one unified KV ring (one per engine).

    Ring slots 0 .. capacity-1 belong to requests (engine/scheduling/kv_ring.py); slot ``capacity``
    is the scratch slot that padding rows write to and no request ever reads.
    """

    def __init__(self, runner: ModelRunner, capacity: int, restrict_to_action_tokens: bool,
                 is_dense: bool, kernels: LayerKernels):
        self.runner = runner
        self.is_dense = is_dense     # the reference: one (T x ring) mask instead of segments
        self.kernels = kernels       # ``ModelRunner.kernels_for`` the engine's configuration
        self.scratch_slot = capacity
        self.cache = runner.new_cache(capacity + 1)
        self.restrict_to_action_tokens = restrict_to_action_tokens
        self.forward = PackedForward(self._step, runner.device, runner.use_cuda_graphs)

    def _step(self, batch: StepBatch, ints: dict, dense: dict) -> dict:
        """Embeddings -> verifier -> greedy tokens; what a CUDA graph of this bucket holds."""
        runner = self.runner
        lp = batch.num_prefill
        # Rows: the prefill blocks, then the segments'. A step of prefills only (or of segments
        # only) embeds and concatenates nothing for the missing part (the shapes are the
        # bucket's, so a graph takes the same path every replay).
        has_segments = ints['token_ids'].shape[0] > 0
        inputs, reads = [], []
        if lp:
            prompts = dense['prefill_embeds']
            if 'prefill_chain_rows' in ints:     # speculative prefill: drafted chain rows
                prompts = prompts.index_copy(0, ints['prefill_chain_rows'],
                                             runner.embed_tokens(ints['prefill_chain_ids']))
            inputs.append(prompts)
        if has_segments:
            inputs.append(runner.embed_tokens(ints['token_ids']))
        if self.is_dense:
            batch = dense_batch(batch, self.cache.num_slots)
        hidden = runner.lm.forward_hidden(_joined(inputs), batch, self.cache, self.kernels)
        # Greedy rows: each prefill's read rows (its last real row, then any drafted chain rows,
        # padded), then every segment row (padding included).
        if lp:
            reads.append(hidden.index_select(0, ints['prefill_read']))
        if has_segments:
            reads.append(hidden[lp:])
        rows = _joined(reads)
        return {'hidden': hidden,
                'tokens': runner.greedy_rows(rows, self.restrict_to_action_tokens)}

    def run(self, step: HostStep, prefill_embeds: Sequence[torch.Tensor] = ()):
        """-> (greedy tokens as a list: ``step.reads_per_prefill`` per prefill (its read rows,
        ``pack_step``), then one per segment row, hidden states (T, H) on the device, valid
        until the next ``run``).
        ``prefill_embeds``: one (L, H) tensor per prefill block (its prompt); a block longer
        than its tensor (a drafted chain, padding) is filled with zero rows, and the chain
        rows' embeddings are written over them on the device (``pack_step``)."""
        dense = {}
        if step.num_prefill:
            if len(prefill_embeds) != len(step.prefill_blocks):
                raise ValueError(f'prefill_embeds: {len(prefill_embeds)} tensors for '
                                 f'{len(step.prefill_blocks)} prefill blocks')
            parts = []
            for embeds, block in zip(prefill_embeds, step.prefill_blocks):
                parts.append(embeds)
                if block > embeds.shape[0]:
                    parts.append(embeds.new_zeros(block - embeds.shape[0], embeds.shape[1]))
            dense['prefill_embeds'] = torch.cat(parts) if len(parts) > 1 else parts[0]
        out = self.forward(step, dense)
        return out['tokens'].tolist(), out['hidden']      # the step's one device -> host read


def dense_batch(batch: StepBatch, num_slots: int) -> StepBatch:
    """The same step with one dense (T, num_slots) mask (the reference attention path).

    Row i of a prefill block reads that block's slots up to its own; row j of segment s reads
    ``kv_index[s, k]`` wherever ``seg_mask[s, j, k]``. Reads the mask back to the host
    (``nonzero``): never used in a graph.
    """
    lp = batch.num_prefill
    num_rows_total = batch.positions.shape[0]
    mask = torch.zeros(num_rows_total, num_slots, dtype=torch.bool,
                       device=batch.positions.device)
    start = 0
    prefixes = batch.prefill_prefix.tolist() if batch.prefill_prefix is not None \
        else [0] * len(batch.prefill_blocks)
    for block, prefix in zip(batch.prefill_blocks, prefixes):
        rows, cols = torch.tril_indices(block, block, device=mask.device)
        mask[start + rows, batch.slot_mapping[start:start + block][cols]] = True
        if prefix:      # the bidirectional prefix: every row of the block reads it
            mask[start:start + block, batch.slot_mapping[start:start + prefix]] = True
        start += block
    if batch.kv_index is not None:
        num_rows = batch.seg_mask.shape[1]
        seg, row, col = batch.seg_mask.nonzero(as_tuple=True)
        mask[lp + seg * num_rows + row, batch.kv_index[seg, col]] = True
    return StepBatch(positions=batch.positions, slot_mapping=batch.slot_mapping,
                     attn_mask=mask, kv_limit=num_slots, copy_src=batch.copy_src,
                     copy_dst=batch.copy_dst)
