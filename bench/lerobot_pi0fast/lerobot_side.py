"""LeRobot's own pi0_fast (lerobot[pi]==0.6.1) on a checkpoint folder, offline.

Runs under a separate Python >= 3.12 environment that has LeRobot installed (README.md beside
this file), never under the project's Python. Given a checkpoint folder in LeRobot's layout
(``vla-spec make-checkpoint --preset pi0fast-tiny`` writes one) and a frames file written by
``compare_tokens.py``, it

1. checks that LeRobot's strict ``PreTrainedConfig`` parser reads the folder's config.json;
2. copies the folder under ``--work`` unchanged (hard links), except that the FAST tokenizer
   folder gets a ``processor_config.json`` with an ``auto_map`` and a small local processor
   module (LeRobot loads the FAST processor with ``AutoProcessor.from_pretrained(...,
   trust_remote_code=True)``; the published one is code on a hub);
3. loads the copy with ``PI0FastPolicy.from_pretrained`` (strict, LeRobot's default) and
   ``make_pre_post_processors(cfg, pretrained_path=...)`` as a LeRobot user does, with the
   copy as working directory (LeRobot resolves the folder's relative tokenizer names there),
   and checks that every tensor of the policy equals the file (LeRobot prints and continues
   when loading fails, leaving random weights) and that the file's keys are exactly those
   LeRobot's own ``save_pretrained`` writes;
4. runs each frame (its raw state: LeRobot's preprocessor normalises it with the folder's
   statistics) through LeRobot's preprocessor and ``predict_action_chunk`` (greedy, KV cache;
   and again with ``use_kv_cache`` off), keeping the generated ids;
5. optionally (frames file with the project's prompt ids) runs LeRobot's decoding loop on the
   project's prompt ids instead of LeRobot's own prompt, to separate prompt differences from
   model differences;
6. writes everything to ``--out`` (JSON).

PaliGemma dimensions: LeRobot 0.6.1 builds its PaliGemma from ``paligemma_variant`` alone
(``get_gemma_config``: gemma_2b or gemma_300m; SigLIP So400m with ``intermediate_size`` 4304
and ``projection_dim`` 2048 written in ``PI0FastPaliGemma.__init__``; vocabulary 257152). A
random-weight checkpoint of other dimensions (the pi0fast-tiny preset) needs those numbers
replaced: ``--dims sidecar`` (the default when the folder has ``paligemma_config.json``)
replaces ``get_gemma_config`` and the PaliGemma constructor's configuration in LeRobot's module
namespace with the sidecar's numbers, at construction only. Everything that runs afterwards
(preprocessing, normalisation, prompt, masks, positions, generation) is LeRobot's code,
unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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

def fast_tokenizer_folder(src: Path, out: Path) -> Path:
    """A FAST tokenizer folder as AutoProcessor(trust_remote_code) reads it: its files, a
    processor_config.json with an auto_map and the local processor module."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ('tokenizer.json', 'fast_config.json'):
        if (src / name).is_file() and not (out / name).exists():
            shutil.copy(src / name, out / name)
    if (src / 'processor_config.json').is_file():
        cfg = json.loads((src / 'processor_config.json').read_text())
    else:
        fc = json.loads((src / 'fast_config.json').read_text())
        cfg = {'scale': fc['scale'], 'min_token': fc['min_token'],
               'time_horizon': fc.get('action_horizon'), 'action_dim': fc.get('action_dim'),
               'vocab_size': fc.get('vocab_size')}
    cfg['auto_map'] = {'AutoProcessor': 'local_fast_processor.LocalFastProcessor'}
    (out / 'processor_config.json').unlink(missing_ok=True)       # never write through a link
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

def try_project_config(checkpoint: Path) -> str:
    """Whether LeRobot's PreTrainedConfig parses the project's config.json as it is."""
    from lerobot.configs import PreTrainedConfig
    try:
        cfg = PreTrainedConfig.from_pretrained(str(checkpoint))
        return f'parsed: {type(cfg).__name__}'
    except BaseException as exc:  # noqa: BLE001  (draccus raises SystemExit-like errors too)
        return f'{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ""}'


PREFIX = 'model.paligemma_with_expert.paligemma.'
EMBED = PREFIX + 'model.language_model.embed_tokens.weight'
LM_HEAD = PREFIX + 'lm_head.weight'


def lerobot_copy(checkpoint: Path, work: Path) -> tuple[Path, dict]:
    """The checkpoint folder as LeRobot loads it: every file as it is (hard links where
    possible), the FAST tokenizer folder with the local processor added."""
    raw = json.loads((checkpoint / 'config.json').read_text())
    fast_name = raw.get('action_tokenizer_name', 'fast_tokenizer')
    if Path(fast_name).is_absolute():
        raise SystemExit(f'action_tokenizer_name {fast_name!r} is absolute: not supported here')
    out = work / 'lerobot_checkpoint'
    if out.exists():
        shutil.rmtree(out)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(checkpoint, out, copy_function=link)
    fast = out / fast_name
    before = {p.name for p in fast.iterdir()}
    fast_tokenizer_folder(fast, fast)
    added = sorted(f'{fast_name}/{p.name}' for p in fast.iterdir() if p.name not in before)
    return out, {'files_added_for_the_fast_processor': added,
                 'config_fields_written_by_the_project': sorted(raw)}


def saved_keys(policy, work: Path, checkpoint: Path) -> dict:
    """What LeRobot's own save_pretrained writes for this policy (key names), against the
    checkpoint's keys."""
    from safetensors import safe_open
    folder = work / 'lerobot_saved'
    policy.save_pretrained(folder)
    with safe_open(str(folder / 'model.safetensors'), 'pt') as f:
        keys = sorted(f.keys())
        meta = f.metadata()
    with safe_open(str(checkpoint / 'model.safetensors'), 'pt') as f:
        ours = set(f.keys())
    short = sorted({k.replace(PREFIX, '<P>').split('.layers.')[0] for k in keys})
    return {'files': sorted(p.name for p in folder.iterdir()), 'num_keys': len(keys),
            'has_lm_head': LM_HEAD in keys, 'has_embed_tokens': EMBED in keys,
            'key_stems': short, 'metadata': meta,
            'checkpoint_keys_equal_lerobot_save': ours == set(keys),
            'lerobot_keys_not_in_checkpoint': sorted(set(keys) - ours)[:10],
            'checkpoint_keys_not_in_lerobot_save': sorted(ours - set(keys))[:10]}


def check_weights(policy, checkpoint: Path) -> dict:
    """Every tensor of the policy against the safetensors file, key for key (LeRobot keeps
    going when the state dict does not load)."""
    from safetensors.torch import load_file
    disk = load_file(str(checkpoint / 'model.safetensors'))
    own = policy.state_dict()
    mismatched = [k for k, v in disk.items() if k not in own or not torch.equal(
        own[k].to(torch.float32), v.to(torch.float32))]
    not_in_file = sorted(k for k in own if k not in disk)
    tied = LM_HEAD in own and EMBED in own and own[LM_HEAD].data_ptr() == own[EMBED].data_ptr()
    return {'file_tensors': len(disk), 'policy_tensors': len(own),
            'file_tensors_not_equal_in_policy': mismatched[:10],
            'policy_tensors_not_in_file': not_in_file[:10],
            'lm_head_shares_storage_with_embed_tokens': bool(tied),
            'loaded_exactly': not mismatched and not not_in_file}


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
    folder, info = lerobot_copy(checkpoint, work)
    report.update(info)
    os.chdir(folder)            # LeRobot resolves relative tokenizer names from here
    t0 = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        policy = PI0FastPolicy.from_pretrained(str(folder), strict=args.strict)
    policy.eval()
    report['load_s'] = round(time.perf_counter() - t0, 3)
    report['load_printed'] = [ln for ln in printed.getvalue().splitlines()
                              if ln.startswith(('Missing', 'Unexpected', 'Warning', 'All keys',
                                                'Remapped', '  - '))]
    report['weights'] = check_weights(policy, checkpoint)
    report['lerobot_save_pretrained'] = saved_keys(policy, work, checkpoint)
    if not report['weights']['loaded_exactly']:
        raise SystemExit(f'LeRobot did not load the checkpoint exactly: {report["weights"]}')
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(folder))
    report['normalization'] = {
        'preprocessor': [s.get_config().get('norm_map') for s in pre.steps
                         if type(s).__name__ == 'NormalizerProcessorStep'],
        'postprocessor': [s.get_config().get('norm_map') for s in post.steps
                          if type(s).__name__ == 'UnnormalizerProcessorStep']}
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
                if use_cache:
                    entry['actions'] = post(chunk)[0].double().tolist()
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
    p.add_argument('--no-strict', dest='strict', action='store_false',
                   help='load_state_dict(strict=False) (LeRobot\'s default is strict)')
    p.add_argument('--threads', type=int, default=0)
    args = p.parse_args(argv)
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f'wrote {args.out}: {len(report["frames"])} frames, weights loaded exactly: '
          f'{report["weights"]["loaded_exactly"]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
