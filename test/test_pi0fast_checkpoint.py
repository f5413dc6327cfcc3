"""pi0-FAST checkpoints in LeRobot's layout (S8 for the second family): the keys' prefix and
their spellings across transformers versions, the registry's choice of family, and a clear
``CheckpointError`` naming the file (and key) for every missing, truncated or mismatched file."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vla_spec_ros.models import registry
from vla_spec_ros.models.pi0fast.checkpoint import LEROBOT_PREFIX, canonical_name
from vla_spec_ros.models.weights import CheckpointError
from vla_spec_ros.policy import VLAPolicy


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return registry.make_checkpoint('pi0fast-tiny', tmp_path_factory.mktemp('ck'), seed=2)


@pytest.fixture
def copy(folder, tmp_path):
    out = tmp_path / 'copy'
    shutil.copytree(folder, out)
    return out


def test_layout_and_family(folder):
    keys = load_file(str(folder / 'model.safetensors')).keys()
    assert all(k.startswith(LEROBOT_PREFIX) for k in keys)
    assert LEROBOT_PREFIX + 'model.language_model.layers.0.self_attn.k_proj.weight' in keys
    assert LEROBOT_PREFIX + 'model.vision_tower.vision_model.post_layernorm.weight' in keys
    assert LEROBOT_PREFIX + 'lm_head.weight' in keys             # explicit, as LeRobot's
    raw = json.loads((folder / 'config.json').read_text())
    assert raw['type'] == 'pi0_fast' and registry.family_of(raw) == 'pi0fast'
    loaded = registry.load(folder)
    assert loaded.family == 'pi0fast' and loaded.model.num_image_slots == 3
    lm = loaded.model.language_model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight


def test_older_key_spellings_load_to_the_same_weights(folder, copy):
    state = load_file(str(folder / 'model.safetensors'))
    old = {}
    for key, value in state.items():
        name = key[len(LEROBOT_PREFIX):]
        name = name.replace('model.vision_tower.vision_model.', 'vision_tower.vision_model.')
        name = name.replace('model.multi_modal_projector.', 'multi_modal_projector.')
        name = name.replace('model.language_model.', 'language_model.model.')
        name = name.replace('lm_head.', 'language_model.lm_head.')
        old[LEROBOT_PREFIX + name] = value
    old[LEROBOT_PREFIX + 'model.vision_tower.vision_model.head.probe'] = torch.zeros(1, 1, 32)
    save_file(old, str(copy / 'model.safetensors'))
    assert canonical_name(LEROBOT_PREFIX + 'language_model.model.norm.weight') == \
        'model.language_model.norm.weight'
    a, b = registry.load(folder).model.state_dict(), registry.load(copy).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # transformers 5.24's PaliGemma: the SigLIP tower without vision_model.
    newer = {k.replace('model.vision_tower.vision_model.', 'model.vision_tower.'): v
             for k, v in state.items()}
    save_file(newer, str(copy / 'model.safetensors'))
    c = registry.load(copy).model.state_dict()
    assert all(torch.equal(a[k], c[k]) for k in a)


def _rewrite(path, change):
    state = load_file(str(path))
    change(state)
    save_file(state, str(path))


@pytest.mark.parametrize('case, message', [
    ('no_weights', 'only pickle weights'),
    ('truncated', 'truncated'),
    ('missing_key', 'missing key'),
    ('wrong_shape', 'has shape'),
    ('foreign_key', 'unexpected key'),
    ('no_fast_tokenizer', 'action_tokenizer_name'),
    ('no_text_tokenizer', 'tokenizer'),
    ('bad_config', 'not valid JSON'),
])
def test_broken_checkpoints_are_named(copy, case, message):
    weights = copy / 'model.safetensors'
    key = LEROBOT_PREFIX + 'model.language_model.layers.1.mlp.up_proj.weight'
    if case == 'no_weights':
        weights.unlink()
        (copy / 'pytorch_model.bin').write_bytes(b'not loaded')
    elif case == 'truncated':
        weights.write_bytes(weights.read_bytes()[:-100])
    elif case == 'missing_key':
        _rewrite(weights, lambda s: s.pop(key))
    elif case == 'wrong_shape':
        _rewrite(weights, lambda s: s.__setitem__(key, torch.zeros(3, 3)))
    elif case == 'foreign_key':
        _rewrite(weights, lambda s: s.__setitem__('model.action_out_proj.weight',
                                                  torch.zeros(2)))
    elif case == 'no_fast_tokenizer':
        shutil.rmtree(copy / 'fast_tokenizer')
    elif case == 'no_text_tokenizer':
        (copy / 'paligemma_tokenizer' / 'tokenizer.json').unlink()
    elif case == 'bad_config':
        (copy / 'config.json').write_text('{"type": "pi0_fast",')
    with pytest.raises((CheckpointError, FileNotFoundError), match=message):
        registry.load(copy)


def test_the_policy_loads_either_family(folder, tmp_path, monkeypatch):
    monkeypatch.setenv('VLA_SPEC_CACHE', str(tmp_path / 'cache'))
    policy = VLAPolicy.from_pretrained(str(folder), mode='ar', dtype='float64')
    assert type(policy.engine.runner.model).__name__ == 'Pi0Fast'
    import numpy as np
    image = np.zeros((40, 30, 3), np.uint8)                     # resized with padding
    result = policy.predict((image, image), 'open the drawer', None,
                            state=np.array([0.5, -0.5, 0.0, 1.0]))
    assert 1 <= len(result.tokens) <= 24
    if not result.is_valid:                   # a random model's tokens: refused, not guessed
        assert np.isnan(result.action).all() and result.invalid_reason
    openvla = VLAPolicy.from_pretrained('tiny', mode='ar')
    assert type(openvla.engine.runner.model).__name__ == 'OpenVLA'
