"""OpenVLA v1 prompt + tokenizer rules and image preprocessing (docs/openvla.md, Prompt and
Image preprocessing).

Expected prompt text, normalisation constants and crop geometry are written out from the
reference, not read from the code under test. Resizing and the centre crop are compared with
OpenVLA's own arithmetic in test_openvla_pixels.py.
"""
import numpy as np
import pytest
import torch

from vla_spec_ros.image_check import ImageError, check_image
from vla_spec_ros.instruction import MAX_INSTRUCTION_CHARS, PromptError
from vla_spec_ros.models.openvla.preprocess import preprocess_image
from vla_spec_ros.models.openvla.prompt import PromptTokenizer, build_tokenizer, format_prompt
from vla_spec_ros.models.registry import preset

# docs/openvla.md, Image preprocessing: as serialised in bf16.
DINO_MEAN = np.array([0.484375, 0.455078125, 0.40625])
DINO_STD = np.array([0.228515625, 0.2236328125, 0.224609375])
SIGLIP_MEAN = np.array([0.5, 0.5, 0.5])
SIGLIP_STD = np.array([0.5, 0.5, 0.5])


@pytest.fixture(scope='module')
def tokenizer():
    return build_tokenizer(1024, seed=0)


@pytest.fixture(scope='module')
def prompt_tokenizer(tokenizer):
    return PromptTokenizer(tokenizer, max_instruction_tokens=32)


@pytest.fixture(scope='module')
def cfg():
    return preset('tiny')


# ---- prompt ----------------------------------------------------------------------------------

def test_v1_prompt_text():
    assert format_prompt('Pick Up the RED cup') == \
        'In: What action should the robot take to pick up the red cup?\nOut:'


def test_encode_starts_with_bos_and_round_trips_text(prompt_tokenizer, tokenizer):
    ids = prompt_tokenizer.encode('Pick up the red cup')
    assert ids[0] == tokenizer.token_to_id('<s>') == 1
    assert ids.count(1) == 1                                 # BOS once, no EOS
    assert tokenizer.token_to_id('</s>') not in ids
    text = tokenizer.decode(ids[:-1], skip_special_tokens=True)
    assert text == 'In: What action should the robot take to pick up the red cup?\nOut:'


def test_trailing_space_token_appended(prompt_tokenizer, tokenizer):
    ids = prompt_tokenizer.encode('open the drawer')
    space = tokenizer.token_to_id('\u2581')
    raw = tokenizer.encode(format_prompt('open the drawer')).ids
    assert raw[-1] != space                 # the v1 prompt ends with "Out:", never with "▁"
    assert ids == raw + [space]


def test_instruction_is_lowercased_and_stripped(prompt_tokenizer):
    assert prompt_tokenizer.encode('  OPEN The Drawer ') == prompt_tokenizer.encode(
        'open the drawer')


class _StubEncoding:
    def __init__(self, ids):
        self.ids = ids


class _StubTokenizer:
    """A tokenizer whose prompts already end with "▁" and that adds no BOS itself."""

    vocab = {'<s>': 1, '\u2581': 7}

    def token_to_id(self, token):
        return self.vocab.get(token)

    def encode(self, text, add_special_tokens=True):
        return _StubEncoding([10 + (ord(c) % 50) for c in text.split()[-1][:3]] + [7])


def test_trailing_space_token_not_duplicated_and_bos_added():
    tok = PromptTokenizer(_StubTokenizer())
    ids = tok.encode('push it')
    assert ids[0] == 1                       # BOS prepended when the tokenizer does not add it
    assert ids[-1] == 7 and ids[-2] != 7     # exactly one trailing "▁"


def test_tokenizer_without_bos_or_space_refused():
    class NoSpace(_StubTokenizer):
        vocab = {'<s>': 1}
    with pytest.raises(ValueError, match='\u2581'):
        PromptTokenizer(NoSpace())


@pytest.mark.parametrize('bad', ['', '   ', '\n\t '])
def test_empty_instruction(prompt_tokenizer, bad):
    with pytest.raises(PromptError, match='empty'):
        prompt_tokenizer.encode(bad)


def test_non_string_instruction(prompt_tokenizer):
    with pytest.raises(PromptError, match='str'):
        prompt_tokenizer.encode(None)


def test_too_long_instruction(prompt_tokenizer):
    with pytest.raises(PromptError, match='characters'):
        prompt_tokenizer.encode('a' * (MAX_INSTRUCTION_CHARS + 1))
    too_many_tokens = ' '.join(['pick up the cup'] * 20)
    with pytest.raises(PromptError, match='max_instruction_tokens'):
        prompt_tokenizer.encode(too_many_tokens)
    assert isinstance(PromptError('x'), ValueError)


def test_instruction_token_limit_counts_instruction_only(tokenizer):
    # The template's own tokens do not count against max_instruction_tokens.
    tok = PromptTokenizer(tokenizer, max_instruction_tokens=1)
    ids = tok.encode('the')                  # "▁the" is one token
    assert ids[-1] == tokenizer.token_to_id('\u2581')
    with pytest.raises(PromptError, match='max_instruction_tokens'):
        tok.encode('pick up the red cup')


# ---- preprocessing ---------------------------------------------------------------------------

def test_output_shape_and_dtype(cfg):
    image = np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)
    out = preprocess_image(image, cfg)
    assert out.shape == (6, cfg.image_size, cfg.image_size) == (6, 56, 56)
    assert out.dtype == torch.float32
    assert preprocess_image(image, cfg, dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize('rgb', [(200, 100, 50), (0, 0, 0), (255, 255, 255)])
def test_constant_image_per_tower_normalisation(cfg, rgb):
    image = np.empty((37, 91, 3), dtype=np.uint8)
    image[...] = rgb
    out = preprocess_image(image, cfg, dtype=torch.float64).numpy()
    value = np.array(rgb) / 255.0
    dino = (value - DINO_MEAN) / DINO_STD
    siglip = (value - SIGLIP_MEAN) / SIGLIP_STD
    for c in range(3):
        np.testing.assert_allclose(out[c], dino[c], atol=1e-12)
        np.testing.assert_allclose(out[3 + c], siglip[c], atol=1e-12)


def test_image_of_model_size_is_only_normalised(cfg):
    image = np.random.default_rng(1).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    out = preprocess_image(image, cfg, dtype=torch.float64).numpy()
    x = image.transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(out[:3], (x - DINO_MEAN[:, None, None]) / DINO_STD[:, None, None],
                               atol=1e-12)
    np.testing.assert_allclose(out[3:], (x - 0.5) / 0.5, atol=1e-12)


def test_rotate_180_equals_rotating_the_input(cfg):
    image = np.random.default_rng(3).integers(0, 256, (60, 90, 3), dtype=np.uint8)
    rotated = preprocess_image(image, cfg, rotate_180=True, dtype=torch.float64)
    expected = preprocess_image(np.rot90(image, 2), cfg, dtype=torch.float64)
    torch.testing.assert_close(rotated, expected, rtol=0, atol=0)
    assert not torch.equal(rotated, preprocess_image(image, cfg, dtype=torch.float64))


def test_center_crop_removes_the_border(cfg):
    # A 3-pixel white frame around a black 200x200 image: the central crop covering 90% of
    # the area has side sqrt(0.9) * 200 = 189.7 (a margin of ~5 pixels), so it keeps no white
    # pixel and the result is exactly black; without the crop the white border leaks into the
    # edge pixels.
    image = np.zeros((200, 200, 3), dtype=np.uint8)
    image[:3], image[-3:], image[:, :3], image[:, -3:] = 255, 255, 255, 255
    black = (0.0 - SIGLIP_MEAN[0]) / SIGLIP_STD[0]
    cropped = preprocess_image(image, cfg, center_crop=True, dtype=torch.float64).numpy()
    np.testing.assert_allclose(cropped[3:], black, atol=1e-12)
    plain = preprocess_image(image, cfg, dtype=torch.float64).numpy()
    assert plain[3:].max() > black + 0.1
    assert np.allclose(plain[3:, 20:36, 20:36], black)     # the centre is black either way


def test_center_crop_keeps_the_centre(cfg):
    # Crop side sqrt(0.9) ~ 0.9487: a 100x100 image keeps about rows/cols 2.6..97.4, inside
    # the white square 1..98, so the result is exactly white.
    image = np.zeros((100, 100, 3), dtype=np.uint8)
    image[1:99, 1:99] = 255
    cropped = preprocess_image(image, cfg, center_crop=True, dtype=torch.float64).numpy()
    white = (1.0 - SIGLIP_MEAN[0]) / SIGLIP_STD[0]
    np.testing.assert_allclose(cropped[3:], white, atol=1e-12)


@pytest.mark.parametrize('bad, match', [
    (np.zeros((32, 32, 3), dtype=np.float32), 'uint8'),
    (np.zeros((32, 32), dtype=np.uint8), 'shape'),
    (np.zeros((32, 32, 4), dtype=np.uint8), 'shape'),
    (np.zeros((3, 32, 32), dtype=np.uint8), 'shape'),
    (np.zeros((1, 32, 3), dtype=np.uint8), 'size'),
    ([[0, 0, 0]], 'numpy'),
])
def test_bad_images(cfg, bad, match):
    with pytest.raises(ImageError, match=match):
        preprocess_image(bad, cfg)
    with pytest.raises(ValueError):
        check_image(bad)
