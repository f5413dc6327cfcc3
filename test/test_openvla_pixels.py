"""The pixels the towers see are OpenVLA's, bit for bit (docs/openvla.md, Image
preprocessing): Pillow's ``resize(..., BICUBIC)`` as its Hugging Face processor calls it, and
the centre crop of its evaluation code (TensorFlow's ``crop_and_resize`` in float32, back to
uint8). The device path (``FrameUploader`` + ``preprocess_pixels``) gives the same pixels.
"""
import hashlib

import numpy as np
import pytest
import torch
from PIL import Image

from vla_spec_ros.engine.device.frame_upload import FrameUploader, HostSource
from vla_spec_ros.models.openvla.preprocess import (crop_center, model_pixels, preprocess_image,
                                                    preprocess_pixels)
from vla_spec_ros.models.registry import preset

# (H, W): up- and down-scaling, odd and non-square, tiny, a 4K camera.
FRAME_SIZES = [(2, 2), (2, 3), (3, 2), (5, 7), (17, 13), (31, 64), (56, 56), (57, 56),
               (64, 64), (64, 96), (97, 131), (120, 160), (200, 200), (223, 224), (224, 224),
               (225, 224), (240, 320), (256, 256), (256, 320), (300, 200), (480, 640),
               (512, 384), (720, 1280), (1080, 1920), (2160, 3840)]
MODEL_SIZES = {'tiny': 56, 'metaworld-demo': 64, 'openvla-7b': 224}
SIGLIP_MEAN = SIGLIP_STD = 0.5


def _frame(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


def _pillow(image, size):
    """What OpenVLA's processor does to a PIL image before ToTensor."""
    return np.asarray(Image.fromarray(image).convert('RGB').resize((size, size),
                                                                   Image.BICUBIC))


def _levels(pixels):
    """(6, S, S) normalised pixels -> the uint8 levels (H, W, 3) behind the SigLIP channels."""
    x = pixels[3:].to(torch.float64).numpy() * SIGLIP_STD + SIGLIP_MEAN
    return np.rint(x * 255.0).astype(np.uint8).transpose(1, 2, 0)


@pytest.mark.parametrize('name', sorted(MODEL_SIZES))
def test_resize_is_pillow_bicubic_for_every_frame_size(name):
    cfg = preset(name)
    size = cfg.image_size
    assert size == MODEL_SIZES[name] == cfg.fused_featurizer.image_size
    for i, shape in enumerate(FRAME_SIZES):
        image = _frame(shape, i)
        expected = _pillow(image, size)
        assert np.array_equal(model_pixels(image, size), expected), shape
        assert np.array_equal(_levels(preprocess_image(image, cfg, dtype=torch.float64)),
                              expected), shape


@pytest.mark.parametrize('shape', [(2, 2), (225, 224), (480, 640), (720, 1280)])
def test_rotation_then_resize_is_pillow_on_the_rotated_frame(shape):
    cfg = preset('openvla-7b')
    image = _frame(shape, 7)
    got = _levels(preprocess_image(image, cfg, rotate_180=True, dtype=torch.float64))
    assert np.array_equal(got, _pillow(np.ascontiguousarray(image[::-1, ::-1]), 224))


def test_frames_at_the_model_size_are_not_resampled():
    image = _frame((64, 64), 8)
    assert model_pixels(image, 64) is image
    assert np.array_equal(model_pixels(image, 64, rotate_180=True), image[::-1, ::-1])


# ---- centre crop -----------------------------------------------------------------------------

def _crop_reference(image, size, area=0.9):
    """OpenVLA's evaluation crop, one output value at a time in float32 scalars: the box
    [(1 - sqrt(area)) / 2, (1 + sqrt(area)) / 2] of each side sampled bilinearly at ``size``
    points corner to corner (TensorFlow's crop_and_resize), then trunc(clip(x) * 255.5)."""
    f = np.float32
    side = np.sqrt(f(area))
    lo = (f(1) - side) / f(2)
    hi = lo + side
    x = image.astype(np.float32) * f(1.0 / 255.0)
    h, w = image.shape[:2]
    out = np.zeros((size, size, 3), np.uint8)

    def where(i, n):
        step = (hi - lo) * f(n - 1) / f(size - 1)
        p = lo * f(n - 1) + f(i) * step
        a = int(np.floor(p))
        return a, int(np.ceil(p)), p - f(a)

    for r in range(size):
        top, bottom, dy = where(r, h)
        for c in range(size):
            left, right, dx = where(c, w)
            for ch in range(3):
                t = x[top, left, ch] + (x[top, right, ch] - x[top, left, ch]) * dx
                b = x[bottom, left, ch] + (x[bottom, right, ch] - x[bottom, left, ch]) * dx
                v = min(max(t + (b - t) * dy, f(0)), f(1)) * f(255.5)
                out[r, c, ch] = int(min(max(v, f(0)), f(255)))
    return out


@pytest.mark.parametrize('shape, size', [((2, 2), 8), ((3, 5), 7), ((31, 17), 12),
                                         ((64, 64), 16), ((225, 224), 10), ((480, 640), 9)])
def test_center_crop_equals_the_scalar_reference(shape, size):
    image = _frame(shape, 9)
    assert np.array_equal(crop_center(image, size), _crop_reference(image, size))


# sha256 of the uint8 output of OpenVLA's crop (tf.image.convert_image_dtype, crop_and_resize
# with the 0.9 area box, clip_by_value, convert_image_dtype(saturate=True)) computed with
# TensorFlow 2.18 on CPU for these seeded frames.
TENSORFLOW_DIGESTS = [
    (0, (48, 80), 56, '9cd100300b42f84007166e9becad24c596b8a126469acaaf658570571c4a0211'),
    (1, (256, 256), 224, 'a56a20e6badf0e404094e60f5825aa49104b14c5d7e3518d8538105f90f2f27f'),
    (2, (480, 640), 224, '63d6f508741c6dbfb69ce8f2de0278903a59c1c78851c99a0e207ddbe3e25378'),
    (3, (7, 5), 64, '6add269a828770048367a8ea7492f4baf6755f55fc269bb8a816d008794c3986'),
]


@pytest.mark.parametrize('seed, shape, size, digest', TENSORFLOW_DIGESTS)
def test_center_crop_equals_tensorflow(seed, shape, size, digest):
    image = _frame(shape, seed)
    got = model_pixels(image, size, center_crop=True)
    assert got.shape == (size, size, 3)
    assert hashlib.sha256(got.tobytes()).hexdigest() == digest


def test_center_crop_then_no_bicubic_pass():
    """The crop samples straight to the model size, so Pillow has nothing left to resize
    (OpenVLA's evaluation crops to 224 x 224, the 7B model's size, before its processor)."""
    cfg = preset('openvla-7b')
    image = _frame((480, 640), 10)
    cropped = crop_center(image, 224)
    got = preprocess_image(image, cfg, center_crop=True, dtype=torch.float64)
    assert np.array_equal(_levels(got), cropped)
    rotated = preprocess_image(image, cfg, center_crop=True, rotate_180=True,
                               dtype=torch.float64)
    assert np.array_equal(_levels(rotated), crop_center(image[::-1, ::-1], 224))


# ---- the device path -------------------------------------------------------------------------

@pytest.mark.parametrize('options', [{}, {'center_crop': True}, {'rotate_180': True},
                                     {'center_crop': True, 'rotate_180': True}])
def test_device_path_equals_the_cpu_path(options):
    """What the engine runs (``FrameUploader.upload`` then ``preprocess_pixels``, here on the
    CPU) equals ``preprocess_image`` bit for bit, resized or not."""
    cfg = preset('tiny')
    uploader = FrameUploader('cpu')
    for i, shape in enumerate([(56, 56), (57, 56), (2, 2), (480, 640), (720, 1280)]):
        image = _frame(shape, 20 + i)
        expected = preprocess_image(image, cfg, dtype=torch.float64, **options)
        got = preprocess_pixels(uploader.upload(image), cfg, **options)
        assert torch.equal(got, expected), (shape, options)


def test_a_resize_reads_the_host_frame_and_uploads_the_result():
    """A device tensor from ``FrameUploader`` carries its host frame: the resize reads that
    (no copy back) and uploads its S x S result through the uploader. Stood in for here by a
    CPU tensor whose own pixels are wrong, so the test can tell which one was read."""
    cfg = preset('tiny')
    image = _frame((90, 120), 30)
    uploads = []

    def upload(pixels):
        uploads.append(pixels.copy())
        return torch.from_numpy(pixels.copy())

    tensor = torch.zeros(image.shape, dtype=torch.uint8)
    tensor.host_source = HostSource(image, upload)
    got = preprocess_pixels(tensor, cfg, rotate_180=True)
    assert len(uploads) == 1 and uploads[0].shape == (56, 56, 3)
    assert np.array_equal(uploads[0], _pillow(np.ascontiguousarray(image[::-1, ::-1]), 56))
    assert torch.equal(got, preprocess_image(image, cfg, rotate_180=True, dtype=torch.float64))
