"""The decodable-chunks test aid (models/pi0fast/decodable.py): a random pi0-FAST checkpoint
whose greedy decoding writes its recorded FAST frame for any observation, in both prompt
styles and in the dtypes a checkpoint is written in, in the reference mode and the default
one; the head must be untied for it."""
import json

import numpy as np
import pytest
import torch

from vla_spec_ros.models.pi0fast.decodable import make_decodable_
from vla_spec_ros.models.pi0fast.family import build_model, configure, make_random
from vla_spec_ros.models.registry import preset
from vla_spec_ros.policy import VLAPolicy


@pytest.mark.parametrize('dtype, style, slots', [('float32', 'lerobot', 3),
                                                 ('bfloat16', 'lerobot', 2),
                                                 ('float32', 'openpi', 1)])
def test_every_frame_is_the_recorded_chunk(tmp_path, dtype, style, slots):
    cfg = configure('pi0fast-tiny', num_image_slots=slots, state_dim=5)
    folder = make_random(cfg, tmp_path / 'ck', seed=2, dtype=dtype, style=style,
                         decodable_chunks=True)
    recorded = json.loads((folder / 'vla_spec_pi0fast.json').read_text())['decodable']
    rng = np.random.default_rng(0)
    for mode in ('ar', 'pipeline_spec'):
        policy = VLAPolicy.from_pretrained(str(folder), mode=mode, dtype=dtype)
        for i in range(3):
            images = tuple(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)
                           for _ in range(slots))
            state = None if i == 0 else rng.normal(0.0, 3.0, 5)
            result = policy.predict(images, 'open the drawer', state=state)
            assert result.is_valid, result.invalid_reason
            assert list(result.tokens) == recorded['frame']
            assert np.array_equal(result.normalized, np.array(recorded['chunk']))


def test_a_plain_random_checkpoint_is_unchanged_by_the_option(tmp_path):
    """Without the option the checkpoint is the one the seed always gave (tied head)."""
    plain = make_random('pi0fast-tiny', tmp_path / 'plain', seed=3)
    extras = json.loads((plain / 'vla_spec_pi0fast.json').read_text())
    assert 'decodable' not in extras
    model = VLAPolicy.from_pretrained(str(plain)).engine.runner.model
    lm = model.language_model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight


def test_a_tied_head_is_refused():
    model = build_model(preset('pi0fast-tiny'), torch.float32, seed=0)
    with pytest.raises(ValueError, match='tied'):
        make_decodable_(model, 2, (10, 11))
