"""LeRobot's own pi0_fast (lerobot[pi]==0.6.1) on a checkpoint folder, offline.

Runs under a separate Python >= 3.12 environment that has LeRobot installed (README.md beside
this file), never under the project's Python. Given a checkpoint folder written by
``vla-spec make-checkpoint --preset pi0fast-tiny`` and a frames file written by
``compare_tokens.py``, it

1. writes a LeRobot checkpoint folder under ``--work``: LeRobot's own ``config.json``
   (``PI0FastConfig`` saved by LeRobot), the same ``model.safetensors`` (a hard link or copy),
   the pre/post processor files saved by LeRobot, and the two tokenizers as local folders
   (``text_tokenizer_name`` / ``action_tokenizer_name`` are absolute local paths; nothing is
   fetched: HF_HUB_OFFLINE=1);
2. loads it back with ``PI0FastPolicy.from_pretrained`` and
   ``make_pre_post_processors(..., pretrained_path=...)`` as a LeRobot user does, and checks
   that every tensor of the policy equals the file (LeRobot prints and continues when loading
   fails, leaving random weights);
3. runs each frame through LeRobot's preprocessor and ``predict_action_chunk`` (greedy, KV
   cache; and again with ``use_kv_cache`` off), keeping the generated ids;
4. optionally (frames file with the project's prompt ids) runs LeRobot's decoding loop on the
   project's prompt ids instead of LeRobot's own prompt, to separate prompt differences from
   model differences;
5. writes everything to ``--out`` (JSON).

PaliGemma dimensions: LeRobot 0.6.1 builds its PaliGemma from ``paligemma_variant`` alone
(``get_gemma_config``: gemma_2b or gemma_300m; SigLIP So400m with ``intermediate_size`` 4304
and ``projection_dim`` 2048 written in ``PI0FastPaliGemma.__init__``; vocabulary 257152). A
random-weight checkpoint of other dimensions (the pi0fast-tiny preset) needs those numbers
replaced: ``--dims sidecar`` (the default when the folder has ``paligemma_config.json``)
replaces ``get_gemma_config`` and the PaliGemma constructor's configuration in LeRobot's module
namespace with the sidecar's numbers, at construction only. Everything that runs afterwards
(preprocessing, prompt, masks, positions, generation) is LeRobot's code, unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('HF_HUB_DISABLE_TELEMETRY', '1')

import numpy as np  # noqa: E402
import torch  # noqa: E402

# The FAST processor LeRobot loads with AutoProcessor.from_pretrained(action_tokenizer_name,
# trust_remote_code=True). The published one lives on a hub; this is a local stand-in with the
# attributes LeRobot 0.6.1 reads (bpe_tokenizer, scale, min_token; decode_actions_with_fast),
# written next to processor_config.json so that AutoProcessor's own auto_map path loads it.
FAST_PROCESSOR_SOURCE = '''\
"""A local FAST processor: the attributes LeRobot's pi0_fast reads, from local files."""
import json
from pathlib import Path

from transformers import PreTrainedTokenizerFast


class LocalFastProcessor:
    def __init__(self, bpe_tokenizer, scale, min_token, time_horizon=None, action_dim=None,
                 vocab_size=None):
        self.bpe_tokenizer = bpe_tokenizer
        self.scale = float(scale)
        self.min_token = int(min_token)
        self.time_horizon = time_horizon
        self.action_dim = action_dim
        self.vocab_size = vocab_size

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoProcessor"):
        pass

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        path = Path(path)
        cfg = json.loads((path / "processor_config.json").read_text())
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
        return cls(tok, cfg["scale"], cfg["min_token"], cfg.get("time_horizon"),
                   cfg.get("action_dim"), cfg.get("vocab_size"))

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("inference only: action encoding is not part of this run")
'''


def versions() -> dict:
    import lerobot
    import transformers
    try:
        from importlib.metadata import version
        lerobot_version = version('lerobot')
    except Exception:  # noqa: BLE001
        lerobot_version = getattr(lerobot, '__version__', '?')
    return {'python': sys.version.split()[0], 'lerobot': lerobot_version,
            'torch': torch.__version__, 'transformers': transformers.__version__,
            'numpy': np.__version__, 'platform': platform.platform(),
            'processor': platform.processor() or platform.machine(),
            'torch_threads': torch.get_num_threads()}


# ---- local tokenizer folders ---------------------------------------------------------------

def text_tokenizer_folder(checkpoint: Path, work: Path) -> Path:
    """The checkpoint's tokenizer.json as a folder AutoTokenizer reads offline."""
    out = work / 'paligemma_tokenizer'
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(checkpoint / 'tokenizer.json', out / 'tokenizer.json')
    (out / 'tokenizer_config.json').write_text(json.dumps({
        'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<bos>',
        'eos_token': '<eos>', 'pad_token': '<pad>', 'unk_token': '<unk>',
        'model_max_length': 1000000}, indent=2))
    return out


def fast_tokenizer_folder(checkpoint: Path, work: Path) -> Path:
    """The checkpoint's FAST tokenizer as a folder AutoProcessor(trust_remote_code) reads."""
    src = checkpoint / 'fast_tokenizer'
    out = work / 'fast_tokenizer'
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / 'tokenizer.json', out / 'tokenizer.json')
    if (src / 'processor_config.json').is_file():
        cfg = json.loads((src / 'processor_config.json').read_text())
    else:
        fc = json.loads((src / 'fast_config.json').read_text())
        cfg = {'scale': fc['scale'], 'min_token': fc['min_token'],
               'time_horizon': fc.get('action_horizon'), 'action_dim': fc.get('action_dim'),
               'vocab_size': fc.get('vocab_size')}
    cfg['auto_map'] = {'AutoProcessor': 'local_fast_processor.LocalFastProcessor'}
    (out / 'processor_config.json').write_text(json.dumps(cfg, indent=2))
    (out / 'local_fast_processor.py').write_text(FAST_PROCESSOR_SOURCE)
    return out


# ---- PaliGemma dimensions ------------------------------------------------------------------

def patch_dimensions(sidecar: dict) -> dict:
    """Make LeRobot's PI0FastPaliGemma build the sidecar's dimensions (module docstring)."""
    from lerobot.policies.pi0_fast import modeling_pi0_fast as m
    text, vision = sidecar['text_config'], sidecar['vision_config']
    width = int(text['hidden_size'])
    gemma = m.GemmaConfig(width=width, depth=int(text['num_hidden_layers']),
                          mlp_dim=int(text['intermediate_size']),
                          num_heads=int(text['num_attention_heads']),
                          num_kv_heads=int(text['num_key_value_heads']),
                          head_dim=int(text['head_dim']))
    m.get_gemma_config = lambda variant: gemma
    real = m.PaliGemmaForConditionalGenerationWithPiGemma
    vocab = int(text['vocab_size'])
    notes = {}

    def build(config):
        v = config.vision_config
        for key in ('hidden_size', 'intermediate_size', 'num_hidden_layers',
                    'num_attention_heads', 'image_size', 'patch_size'):
            setattr(v, key, int(vision[key]))
        v.layer_norm_eps = float(vision.get('layer_norm_eps', v.layer_norm_eps))
        v.hidden_act = vision.get('hidden_act', v.hidden_act)
        v.projection_dim = width
        config.projection_dim = width
        config.hidden_size = width
        config.text_config.vocab_size = vocab
        config._vocab_size = vocab  # noqa: SLF001
        config.image_token_index = vocab
        if hasattr(config, 'image_token_id'):
            config.image_token_id = vocab
        t = config.text_config
        t.rms_norm_eps = float(text.get('rms_norm_eps', t.rms_norm_eps))
        theta = float(text.get('rope_theta', 10000.0))
        rope = getattr(t, 'rope_parameters', None)
        if isinstance(rope, dict):
            if float(rope.get('rope_theta', theta)) != theta:
                rope['rope_theta'] = theta
                notes['rope_theta'] = theta
        t.max_position_embeddings = int(text.get('max_position_embeddings',
                                                 t.max_position_embeddings))
        notes['text_config'] = {k: getattr(t, k) for k in (
            'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads',
            'head_dim', 'intermediate_size', 'vocab_size', 'rms_norm_eps',
            'max_position_embeddings', 'hidden_activation')}
        notes['vision_config'] = {k: getattr(v, k) for k in (
            'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads',
            'image_size', 'patch_size', 'layer_norm_eps', 'hidden_act', 'projection_dim')}
        return real(config)

    m.PaliGemmaForConditionalGenerationWithPiGemma = build
    return notes


# ---- checkpoint ---------------------------------------------------------------------------

def dataset_stats(checkpoint: Path, state_dim: int, action_dim: int) -> dict:
    """LeRobot's stats dict from the checkpoint's dataset_statistics.json (first key)."""
    raw = json.loads((checkpoint / 'dataset_statistics.json').read_text())
    entry = next(iter(raw.values()))
    action = entry['action']
    stats = {'action': {k: torch.tensor(action[k], dtype=torch.float32)
                        for k in ('mean', 'std', 'min', 'max', 'q01', 'q99') if k in action}}
    proprio = entry.get('proprio') or {}
    stats['observation.state'] = {
        k: torch.tensor(proprio.get(k, [0.0] * state_dim), dtype=torch.float32)
        for k in ('mean', 'std', 'min', 'max', 'q01', 'q99')}
    return stats


def try_project_config(checkpoint: Path) -> str:
    """Whether LeRobot's PreTrainedConfig parses the project's config.json as it is."""
    from lerobot.configs import PreTrainedConfig
    try:
        cfg = PreTrainedConfig.from_pretrained(str(checkpoint))
        return f'parsed: {type(cfg).__name__}'
    except BaseException as exc:  # noqa: BLE001  (draccus raises SystemExit-like errors too)
        return f'{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ""}'


def make_lerobot_checkpoint(checkpoint: Path, work: Path, args) -> tuple[Path, dict]:
    from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi0_fast.configuration_pi0_fast import PI0FastConfig

    raw = json.loads((checkpoint / 'config.json').read_text())
    text_dir = text_tokenizer_folder(checkpoint, work)
    fast_dir = fast_tokenizer_folder(checkpoint, work)
    inputs = {}
    for key, feat in raw['input_features'].items():
        inputs[key] = PolicyFeature(type=FeatureType[feat['type']], shape=tuple(feat['shape']))
    outputs = {key: PolicyFeature(type=FeatureType[feat['type']], shape=tuple(feat['shape']))
               for key, feat in raw['output_features'].items()}
    max_tokens = int(raw.get('max_action_tokens', 256))
    cfg = PI0FastConfig(
        input_features=inputs, output_features=outputs,
        chunk_size=int(raw['chunk_size']), n_action_steps=int(raw.get('n_action_steps',
                                                                      raw['chunk_size'])),
        max_state_dim=int(raw.get('max_state_dim', 32)),
        max_action_dim=int(raw.get('max_action_dim', 32)),
        max_action_tokens=max_tokens, max_decoding_steps=max_tokens,
        fast_skip_tokens=int(raw.get('fast_skip_tokens', 128)),
        paligemma_variant=raw.get('paligemma_variant', 'gemma_2b'),
        text_tokenizer_name=str(text_dir), action_tokenizer_name=str(fast_dir),
        image_resolution=tuple(next(f.shape for f in inputs.values()
                                    if f.type == FeatureType.VISUAL)[1:]),
        dtype='float32', device='cpu', use_kv_cache=True, temperature=0.0,
        # The project's frames carry an already-normalised state (VLAPolicy.predict's state);
        # LeRobot's default for STATE is MEAN_STD from the processor's statistics.
        normalization_mapping={'VISUAL': NormalizationMode.IDENTITY,
                               'STATE': NormalizationMode.IDENTITY,
                               'ACTION': NormalizationMode.MEAN_STD})
    out = work / 'lerobot_checkpoint'
    out.mkdir(parents=True, exist_ok=True)
    cfg._save_pretrained(out)  # noqa: SLF001  (LeRobot's own writer of config.json)
    target = out / 'model.safetensors'
    if target.exists():
        target.unlink()
    renamed = {}
    if args.convert_keys:
        renamed = write_lerobot_weights(checkpoint / 'model.safetensors', target)
    else:
        try:
            os.link(checkpoint / 'model.safetensors', target)
        except OSError:
            shutil.copy(checkpoint / 'model.safetensors', target)
    state_dim = inputs['observation.state'].shape[-1]
    action_dim = outputs['action'].shape[-1]
    pre, post = make_pre_post_processors(cfg, dataset_stats=dataset_stats(
        checkpoint, state_dim, action_dim))
    pre.save_pretrained(out)
    post.save_pretrained(out)
    return out, {'config_fields': json.loads((out / 'config.json').read_text()),
                 'key_conversion': renamed}


PREFIX = 'model.paligemma_with_expert.paligemma.'
VISION_OLD, VISION_NEW = PREFIX + 'model.vision_tower.', PREFIX + 'model.vision_tower.vision_model.'
EMBED = PREFIX + 'model.language_model.embed_tokens.weight'
LM_HEAD = PREFIX + 'lm_head.weight'


def write_lerobot_weights(src: Path, dst: Path) -> dict:
    """The project's file with the two spellings LeRobot 0.6.1 (transformers 5.5) loads:
    SigLIP under ``vision_tower.vision_model.`` and an explicit ``lm_head.weight`` (LeRobot's
    lm_head is not tied to the embedding table; ``_fix_pytorch_state_dict_keys`` copies a
    file's lm_head into embed_tokens). Values unchanged."""
    from safetensors.torch import load_file, save_file
    state = load_file(str(src))
    out, moved = {}, 0
    for key, value in state.items():
        if key.startswith(VISION_OLD) and not key.startswith(VISION_NEW):
            key = VISION_NEW + key[len(VISION_OLD):]
            moved += 1
        out[key] = value
    added = []
    if LM_HEAD not in out and EMBED in out:
        out[LM_HEAD] = out[EMBED].clone()
        added.append(LM_HEAD)
    save_file(out, str(dst), metadata={'format': 'pt'})
    return {'vision_keys_moved_under_vision_model': moved, 'added': added}


def load_as_is(checkpoint: Path, work: Path, args) -> dict:
    """LeRobot's from_pretrained on the project's file as written (strict=False and LeRobot's
    default strict=True): what a LeRobot user would get."""
    import contextlib
    import io
    from lerobot.policies.pi0_fast.modeling_pi0_fast import PI0FastPolicy
    folder = work / 'as_is'
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / 'lerobot_checkpoint' / 'config.json', folder / 'config.json')
    target = folder / 'model.safetensors'
    if not target.exists():
        shutil.copy(checkpoint / 'model.safetensors', target)
    result = {}
    for strict in (False, True):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            policy = PI0FastPolicy.from_pretrained(str(folder), strict=strict)
        lines = [ln for ln in buf.getvalue().splitlines()
                 if ln.startswith(('Missing', 'Unexpected', 'Warning', 'All keys'))]
        check = check_weights(policy, checkpoint)
        result[f'strict={strict}'] = {'printed': lines,
                                      'file_tensors_not_equal_in_policy':
                                      len(check['file_tensors_not_equal_in_policy']),
                                      'loaded_exactly': check['loaded_exactly']}
    return result


def saved_keys(policy, work: Path) -> dict:
    """What LeRobot's own save_pretrained writes for this policy (key names)."""
    from safetensors import safe_open
    folder = work / 'lerobot_saved'
    policy.save_pretrained(folder)
    with safe_open(str(folder / 'model.safetensors'), 'pt') as f:
        keys = sorted(f.keys())
        meta = f.metadata()
    short = sorted({k.replace(PREFIX, '<P>').split('.layers.')[0] for k in keys})
    return {'files': sorted(p.name for p in folder.iterdir()), 'num_keys': len(keys),
            'has_lm_head': LM_HEAD in keys, 'has_embed_tokens': EMBED in keys,
            'key_stems': short, 'metadata': meta}


def check_weights(policy, checkpoint: Path) -> dict:
    """Every tensor of the policy against the safetensors file (LeRobot keeps going when the
    state dict does not load)."""
    from safetensors.torch import load_file
    disk = {}
    for key, value in load_file(str(checkpoint / 'model.safetensors')).items():
        if key.startswith(VISION_OLD) and not key.startswith(VISION_NEW):
            key = VISION_NEW + key[len(VISION_OLD):]      # same tensor, LeRobot's spelling
        disk[key] = value
    own = policy.state_dict()
    lm, emb = LM_HEAD, EMBED
    mismatched = [k for k, v in disk.items() if k not in own or not torch.equal(
        own[k].to(torch.float32), v.to(torch.float32))]
    not_in_file = sorted(k for k in own if k not in disk)
    tied = lm in own and emb in own and own[lm].data_ptr() == own[emb].data_ptr()
    head_equal = lm in own and emb in disk and torch.equal(own[lm].float(), disk[emb].float())
    return {'file_tensors': len(disk), 'policy_tensors': len(own),
            'file_tensors_not_equal_in_policy': mismatched[:10],
            'policy_tensors_not_in_file': not_in_file[:10],
            'lm_head_shares_storage_with_embed_tokens': bool(tied),
            'lm_head_equals_file_embed_tokens': bool(head_equal),
            'loaded_exactly': not mismatched and set(not_in_file) <= {lm} and head_equal}


# ---- running ------------------------------------------------------------------------------

class _PromptShim:
    """Stands in for LeRobot's PaliGemma tokenizer inside its decoding loop so that the loop
    appends the project's last prompt id where LeRobot appends BOS (same-prompt run)."""

    def __init__(self, real, last_id):
        self._real = real
        self.bos_token_id = int(last_id)

    def convert_tokens_to_ids(self, token):
        return self._real.convert_tokens_to_ids(token)


def cut_at(ids: list[int], end_id: int) -> list[int]:
    return ids[:ids.index(end_id) + 1] if end_id in ids else ids


def run(args) -> dict:
    checkpoint = Path(args.checkpoint).resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix='lerobot_pi0fast_')).resolve()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {'versions': versions(), 'checkpoint': str(checkpoint), 'work': str(work),
              'hf_hub_offline': os.environ.get('HF_HUB_OFFLINE')}

    sidecar_file = checkpoint / 'paligemma_config.json'
    dims = args.dims
    if dims == 'auto':
        dims = 'sidecar' if sidecar_file.is_file() else 'variant'
    report['dims'] = dims
    if dims == 'sidecar':
        report['dims_patch'] = patch_dimensions(json.loads(sidecar_file.read_text()))

    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi0_fast.modeling_pi0_fast import PI0FastPolicy

    report['project_config_json_in_lerobot'] = try_project_config(checkpoint)
    folder, info = make_lerobot_checkpoint(checkpoint, work, args)
    report.update(info)
    if not args.skip_as_is:
        report['project_file_loaded_as_is'] = load_as_is(checkpoint, work, args)
    t0 = time.perf_counter()
    policy = PI0FastPolicy.from_pretrained(str(folder), strict=args.strict)
    policy.eval()
    report['load_s'] = round(time.perf_counter() - t0, 3)
    report['weights'] = check_weights(policy, checkpoint)
    report['lerobot_save_pretrained'] = saved_keys(policy, work)
    if not report['weights']['loaded_exactly']:
        raise SystemExit(f'LeRobot did not load the checkpoint exactly: {report["weights"]}')
    # LeRobot's saved action_tokenizer_processor entry omits paligemma_tokenizer_name (its
    # default is the hub's google/paligemma-3b-pt-224): a local override is needed offline.
    pre, _post = make_pre_post_processors(
        policy.config, pretrained_path=str(folder), preprocessor_overrides={
            'action_tokenizer_processor': {
                'paligemma_tokenizer_name': policy.config.text_tokenizer_name}})
    report['lerobot_checkpoint_files'] = sorted(p.name for p in folder.iterdir())

    tok = policy._paligemma_tokenizer  # noqa: SLF001
    bar_id = tok.convert_tokens_to_ids('|')
    report['text_tokenizer'] = {'bos_token_id': tok.bos_token_id, 'eos_token_id':
                                tok.eos_token_id, 'bar_id': bar_id,
                                'vocab_size_attr': tok.vocab_size, 'len': len(tok),
                                'action_prefix_ids': tok.encode('Action: ',
                                                                add_special_tokens=False)}

    data = np.load(args.frames, allow_pickle=False)
    images, counts = data['images'], data['num_images']
    states, instructions = data['states'], [str(s) for s in data['instructions']]
    project_ids = None
    if 'project_prompt_ids' in data.files:
        flat, offsets = data['project_prompt_ids'], data['project_prompt_offsets']
        project_ids = [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(len(counts))]
    image_keys = list(policy.config.image_features)
    report['image_keys'] = image_keys

    margins: list[float] = []

    def record_margin(_module, _inputs, output):
        top = torch.topk(output[:, -1].float(), 2, dim=-1).values
        margins.append(float((top[:, 0] - top[:, 1]).min()))

    hook = policy.model.paligemma_with_expert.paligemma.lm_head.register_forward_hook(
        record_margin)
    captured = {}
    real_kv = policy.model.sample_actions_fast_kv_cache
    real_full = policy.model.sample_actions_fast

    def capture_kv(*a, **k):
        captured['tokens'] = real_kv(*a, **k)
        return captured['tokens']

    def capture_full(*a, **k):
        captured['tokens'] = real_full(*a, **k)
        return captured['tokens']

    policy.model.sample_actions_fast_kv_cache = capture_kv
    policy.model.sample_actions_fast = capture_full

    frames = []
    for i in range(len(counts)):
        batch = {}
        for slot in range(int(counts[i])):
            img = torch.from_numpy(images[i, slot]).permute(2, 0, 1).to(torch.float32) / 255.0
            batch[image_keys[slot]] = img
        batch['observation.state'] = torch.from_numpy(states[i]).to(torch.float32)
        batch['task'] = instructions[i]
        processed = pre(batch)
        lang = processed['observation.language.tokens'][0]
        mask = processed['observation.language.attention_mask'][0]
        prefix = lang[mask].tolist() + [tok.bos_token_id]
        entry = {'frame': i, 'num_images': int(counts[i]), 'lerobot_prompt_ids': prefix,
                 'lerobot_prompt_text': tok.decode(lang[mask].tolist())}
        for use_cache in (True, False):
            policy.config.use_kv_cache = use_cache
            margins.clear()
            captured.clear()
            t0 = time.perf_counter()
            try:
                chunk = policy.predict_action_chunk(processed)
                decoded = f'ok {tuple(chunk.shape)}'
            except Exception as exc:  # noqa: BLE001  (LeRobot asserts on the "Action:" prefix)
                decoded = f'{type(exc).__name__}: {str(exc)[:200]}'
            elapsed = time.perf_counter() - t0
            ids = cut_at(captured['tokens'][0].tolist(), bar_id)
            key = 'kv' if use_cache else 'no_kv'
            entry[f'tokens_{key}'] = ids
            entry[f'seconds_{key}'] = round(elapsed, 4)
            entry[f'detokenize_{key}'] = decoded
            if use_cache:
                entry['top2_margins'] = [round(m, 6) for m in margins[:len(ids)]]
        policy.config.use_kv_cache = True
        if project_ids is not None:
            with torch.no_grad():
                imgs, img_masks = policy._preprocess_images(processed)  # noqa: SLF001
                ids = project_ids[i]
                shim_tokens = torch.tensor([ids[:-1]], dtype=torch.long)
                shim_masks = torch.ones_like(shim_tokens, dtype=torch.bool)
                saved = policy.model._paligemma_tokenizer  # noqa: SLF001
                policy.model._paligemma_tokenizer = _PromptShim(saved, ids[-1])  # noqa: SLF001
                margins.clear()
                try:
                    out = real_kv(imgs, img_masks, shim_tokens, shim_masks,
                                  max_decoding_steps=policy.config.max_decoding_steps,
                                  temperature=0.0)
                finally:
                    policy.model._paligemma_tokenizer = saved  # noqa: SLF001
            entry['tokens_project_prompt'] = cut_at(out[0].tolist(), bar_id)
            entry['top2_margins_project_prompt'] = [
                round(m, 6) for m in margins[:len(entry['tokens_project_prompt'])]]
        frames.append(entry)
    hook.remove()
    report['frames'] = frames
    report['max_decoding_steps'] = policy.config.max_decoding_steps
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--checkpoint', required=True, help='pi0-FAST folder (LeRobot layout)')
    p.add_argument('--frames', required=True, help='.npz written by compare_tokens.py')
    p.add_argument('--out', required=True, help='JSON to write')
    p.add_argument('--work', help='scratch folder for the LeRobot checkpoint (default: temp)')
    p.add_argument('--dims', choices=['auto', 'sidecar', 'variant'], default='auto')
    p.add_argument('--strict', action='store_true',
                   help='load_state_dict(strict=True), LeRobot\'s default (fails on a file '
                        'without lm_head.weight; LeRobot then prints and keeps random weights)')
    p.add_argument('--threads', type=int, default=0)
    p.add_argument('--no-convert-keys', dest='convert_keys', action='store_false',
                   help='hand LeRobot the project\'s model.safetensors unchanged')
    p.add_argument('--skip-as-is', action='store_true',
                   help='skip loading the unchanged file (a report of what LeRobot does)')
    args = p.parse_args(argv)
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f'wrote {args.out}: {len(report["frames"])} frames, weights loaded exactly: '
          f'{report["weights"]["loaded_exactly"]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
