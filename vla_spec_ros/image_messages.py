"""sensor_msgs Image / CompressedImage <-> numpy RGB arrays (no rclpy: the node, the simulator
bridge and the bag reader share these).

The model takes an (H, W, 3) uint8 RGB image. Camera drivers publish many layouts; this file
turns the common ones into that array and back (the back direction serves tests and the
simulator bridge).

Conventions followed (sensor_msgs/msg/Image.msg):
- `step` is the row length in bytes and may exceed `width * channels * bytes_per_channel`
  (drivers pad rows for alignment); `data` holds `step * height` bytes. Padding is skipped.
- `is_bigendian` gives the byte order of multi-byte channels (the 16-bit encodings here); it
  has no meaning for 8-bit encodings.
- CompressedImage is decoded with OpenCV (`cv2.imdecode`, BGR/BGRA/gray out), as cv_bridge's
  `compressed_imgmsg_to_cv2` does; the `format` string is informational only. Its size is
  read from the file header first (Pillow, no decoding) and refused there when a side is
  outside what the model takes: a small PNG can decode to gigabytes, and decoding it would
  hold up the node's worker for seconds.
- A JPEG is decoded strictly (simplejpeg, libjpeg-turbo with its warnings as errors): a
  truncated end, or a damaged middle that the decoder notices (about half of random damages;
  the rest is valid entropy data and decodes with local errors), is refused instead of
  decoded to smeared blocks the model would act on (OpenCV decodes such data, printing a
  warning nobody reads, and returns it). The pixels are the ones `cv2.imdecode` gives (the
  same library, the same defaults; the tests compare them). CMYK JPEGs are checked the same
  way, then converted by OpenCV.
- 16-bit images are scaled to 8 bits by round(v / 257), which maps 0..65535 onto 0..255 as
  OpenCV's `convertTo(CV_8U, 255 / 65535)` does.

cv_bridge (vision_opencv) is not used, even where it is installed: its `imgmsg_to_cv2` gives
an 8-bit image a row length of `step / channels` pixels, so a row padding that is not a whole
number of pixels shears the image and swaps its colours, and a `step` shorter than a row is
accepted as a narrower image (Humble to Rolling). The numpy path below honours `step` exactly,
refuses what does not add up, and is what the tests pin down against hand-built arrays.
"""
from __future__ import annotations

import io
import warnings

import numpy as np

from vla_spec_ros.image_check import MAX_IMAGE_SIDE, check_image

try:  # cv2 ships with opencv-python-headless (a declared dependency) but keep imports cheap
    import cv2
except ImportError:  # pragma: no cover - install_requires has it
    cv2 = None

try:
    import simplejpeg
except ImportError:  # pragma: no cover - install_requires has it
    simplejpeg = None

JPEG_START = b'\xff\xd8'               # SOI: every JPEG starts with it
_STRICT_JPEG_SPACES = ('Gray', 'YCbCr', 'RGB')   # decoded to RGB by libjpeg-turbo itself

# encoding -> (channels, bytes per channel, channel order as indices that give R, G, B)
_LAYOUTS = {
    'rgb8': (3, 1, (0, 1, 2)),
    'bgr8': (3, 1, (2, 1, 0)),
    'rgba8': (4, 1, (0, 1, 2)),
    'bgra8': (4, 1, (2, 1, 0)),
    'mono8': (1, 1, (0, 0, 0)),
    'rgb16': (3, 2, (0, 1, 2)),
    'bgr16': (3, 2, (2, 1, 0)),
    'rgba16': (4, 2, (0, 1, 2)),
    'bgra16': (4, 2, (2, 1, 0)),
    'mono16': (1, 2, (0, 0, 0)),
}
SUPPORTED_ENCODINGS = tuple(_LAYOUTS)


def _to_uint8(values: np.ndarray) -> np.ndarray:
    """8-bit values as they are, 16-bit ones scaled to 8 bits; anything else (a float HDR or
    TIFF, 32-bit integers) is refused: scaled as 16-bit it would become a black image."""
    if values.dtype == np.uint8:
        return values
    if values.dtype.kind != 'u' or values.dtype.itemsize != 2:      # either byte order
        raise ValueError(f'data: {values.dtype} pixels; expected 8 or 16-bit unsigned')
    # round(v / 257): v / 257 is never a tie (257 is odd; the nearest is 0.002 away, far
    # above float32's error), so OpenCV's scaling (float32, round to nearest) and the integers
    # floor((v + 128) / 257) give the same bytes for all 65536 values (the tests check both).
    # OpenCV takes 0.5 ms for a 1080p rgb16 frame, the integers 8 ms, float64 three times that.
    if cv2 is not None and values.ndim == 3 and values.shape[2] <= 4:
        native = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder('='))
        return cv2.convertScaleAbs(native, alpha=1.0 / 257).reshape(values.shape)
    return ((values.astype(np.uint32) + 128) // 257).astype(np.uint8)


def image_to_rgb(msg) -> np.ndarray:
    """sensor_msgs/Image -> (H, W, 3) uint8 RGB, a fresh C-contiguous array. Raises
    ValueError naming the field on an unsupported encoding or a buffer that does not match
    height / width / step."""
    encoding = str(msg.encoding).lower()
    if encoding not in _LAYOUTS:
        raise ValueError(f'encoding: {msg.encoding!r} is not supported; '
                         f'supported: {", ".join(SUPPORTED_ENCODINGS)}')
    return _image_to_rgb_numpy(msg, encoding)


def _image_to_rgb_numpy(msg, encoding: str) -> np.ndarray:
    channels, depth, order = _LAYOUTS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise ValueError(f'height/width: image is {height}x{width}')
    row_bytes = width * channels * depth
    if step < row_bytes:
        raise ValueError(f'step: {step} bytes per row is less than width * channels * '
                         f'bytes = {row_bytes} for {encoding}')
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size < step * height:
        raise ValueError(f'data: {data.size} bytes, expected step * height = {step * height}')
    # (H, step) bytes -> drop row padding -> (H, W * C * depth)
    rows = data[:step * height].reshape(height, step)[:, :row_bytes]
    if depth == 2:
        dtype = np.dtype('>u2') if msg.is_bigendian else np.dtype('<u2')
        pixels = np.ascontiguousarray(rows).view(dtype).reshape(height, width, channels)
    else:
        pixels = rows.reshape(height, width, channels)
    return rgb_channels(_to_uint8(pixels), order)


# (channels, R G B order) -> the OpenCV conversion that gives RGB
_CV2_TO_RGB = {(3, (2, 1, 0)): 'COLOR_BGR2RGB', (4, (0, 1, 2)): 'COLOR_RGBA2RGB',
               (4, (2, 1, 0)): 'COLOR_BGRA2RGB', (1, (0, 0, 0)): 'COLOR_GRAY2RGB'}


def rgb_channels(pixels: np.ndarray, order: tuple) -> np.ndarray:
    """(H, W, C) uint8 -> a fresh C-contiguous (H, W, 3) array of channels ``order`` (the
    indices that give R, G, B): exactly ``pixels[:, :, list(order)]``. It runs on the worker
    every robot shares, so not as that fancy index, which took 9 ms for a 1080p bgr8 frame:
    OpenCV's channel conversion (0.1 ms), else one strided copy per channel (1.6 ms)."""
    channels = pixels.shape[2]
    name = _CV2_TO_RGB.get((channels, tuple(order)))
    if channels == 3 and tuple(order) == (0, 1, 2):
        return np.array(pixels, order='C', copy=True)
    if cv2 is not None and name is not None:
        return cv2.cvtColor(np.ascontiguousarray(pixels), getattr(cv2, name))
    out = np.empty(pixels.shape[:2] + (3,), dtype=pixels.dtype)
    for i, channel in enumerate(order):
        out[:, :, i] = pixels[:, :, channel]
    return out


def compressed_to_rgb(msg) -> np.ndarray:
    """sensor_msgs/CompressedImage (JPEG, PNG, anything cv2.imdecode reads) -> (H, W, 3) RGB."""
    if cv2 is None:  # pragma: no cover
        raise RuntimeError('decoding CompressedImage needs opencv-python-headless')
    buffer = np.frombuffer(msg.data, dtype=np.uint8)
    if buffer.size == 0:
        raise ValueError('data: empty CompressedImage')
    size = header_size(buffer.tobytes())
    if size is not None and (min(size) < 2 or max(size) > MAX_IMAGE_SIDE):
        raise ValueError(f'height/width: image size {size[0]}x{size[1]} (from its header, not '
                         f'decoded) outside [2, {MAX_IMAGE_SIDE}] pixels per side')
    data = buffer.tobytes()
    if data.startswith(JPEG_START):
        rgb = _strict_jpeg(data)
        if rgb is not None:
            return rgb
    decoded = cv2.imdecode(buffer, cv2.IMREAD_UNCHANGED)
    if decoded is None:
        raise ValueError(f'data: OpenCV could not decode the image (format {msg.format!r})')
    decoded = _to_uint8(decoded)
    if decoded.ndim == 2:
        rgb = cv2.cvtColor(decoded, cv2.COLOR_GRAY2RGB)
    elif decoded.shape[2] == 4:
        rgb = cv2.cvtColor(decoded, cv2.COLOR_BGRA2RGB)
    elif decoded.shape[2] == 3:
        rgb = cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)
    else:
        raise ValueError(f'data: decoded image has {decoded.shape[2]} channels')
    return np.ascontiguousarray(rgb)


def _strict_jpeg(data: bytes) -> np.ndarray | None:
    """A JPEG decoded to (H, W, 3) RGB with libjpeg-turbo's recoverable errors (corrupt
    entropy data, a premature end) raised as ValueError; None when OpenCV is to convert it (a
    CMYK or YCCK JPEG, checked here first). Without simplejpeg nothing is checked (None)."""
    if simplejpeg is None:  # pragma: no cover - install_requires has it
        return None
    try:
        space = simplejpeg.decode_jpeg_header(data)[2]
        if space in _STRICT_JPEG_SPACES:
            return simplejpeg.decode_jpeg(data, colorspace='RGB', strict=True)
        simplejpeg.decode_jpeg(data, colorspace='CMYK', strict=True)
        return None
    except ValueError as exc:
        raise ValueError(f'data: damaged JPEG, not decoded ({exc})') from exc


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a compressed image from its header (Pillow reads the header only),
    or None when Pillow does not know the format (OpenCV may still decode it). ValueError
    for a header announcing more pixels than Pillow opens at all (its decompression-bomb
    limit): far past any side the model takes."""
    from PIL import Image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return tuple(int(side) for side in image.size)
    except Image.DecompressionBombError as exc:
        raise ValueError(f'height/width: {exc} (from its header, not decoded)') from exc
    except Exception:       # unknown or broken header: leave the verdict to the decoder
        return None


def model_rgb(msg) -> np.ndarray:
    """An Image or CompressedImage -> (H, W, 3) uint8 RGB the model accepts: converted as above,
    then checked as the engine checks every image (image_check.check_image: its size), so that
    a caller holding several images (the node's image slots) can name the one refused.
    ValueError naming the field otherwise."""
    rgb = compressed_to_rgb(msg) if hasattr(msg, 'format') else image_to_rgb(msg)
    try:
        return check_image(rgb)
    except ValueError as exc:     # conversion gave (H, W, 3) uint8: only the size can fail
        raise ValueError(f'height/width: {exc}') from exc


def array_to_image(array: np.ndarray, encoding: str = 'rgb8', *, stamp=None,
                   frame_id: str = '', row_padding: int = 0, is_bigendian: bool = False):
    """Array already in `encoding`'s channel layout -> sensor_msgs/Image.

    `array`: (H, W, C) or (H, W) for mono, uint8 for *8 and uint16 for *16 encodings.
    `row_padding` extra bytes are appended to every row (they are set to 0xAB so a reader
    that ignores `step` visibly reads garbage).
    """
    from sensor_msgs.msg import Image

    encoding = encoding.lower()
    if encoding not in _LAYOUTS:
        raise ValueError(f'encoding: {encoding!r} is not supported')
    channels, depth, _ = _LAYOUTS[encoding]
    array = np.asarray(array)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] != channels:
        raise ValueError(f'array: shape {array.shape} does not fit {encoding} '
                         f'({channels} channels)')
    expected = np.uint8 if depth == 1 else np.uint16
    if array.dtype != expected:
        raise ValueError(f'array: dtype {array.dtype}, {encoding} needs {np.dtype(expected)}')
    if row_padding < 0:
        raise ValueError('row_padding: must be >= 0')
    height, width = array.shape[:2]
    if depth == 2:
        array = array.astype('>u2' if is_bigendian else '<u2')
    row = np.ascontiguousarray(array).view(np.uint8).reshape(height, width * channels * depth)
    if row_padding:
        pad = np.full((height, row_padding), 0xAB, dtype=np.uint8)
        row = np.concatenate([row, pad], axis=1)
    msg = Image()
    if stamp is not None:
        msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(height), int(width)
    msg.encoding = encoding
    msg.is_bigendian = int(bool(is_bigendian) and depth == 2)
    msg.step = int(row.shape[1])
    msg.data = np.ascontiguousarray(row).tobytes()
    return msg


def rgb_to_image(rgb: np.ndarray, *, stamp=None, frame_id: str = ''):
    """(H, W, 3) uint8 RGB -> sensor_msgs/Image rgb8 (no padding)."""
    return array_to_image(rgb, 'rgb8', stamp=stamp, frame_id=frame_id)


def rgb_to_compressed(rgb: np.ndarray, image_format: str = 'png', *, quality: int = 95,
                      stamp=None, frame_id: str = ''):
    """(H, W, 3) uint8 RGB -> sensor_msgs/CompressedImage ('png' lossless or 'jpeg')."""
    from sensor_msgs.msg import CompressedImage

    if image_format not in ('png', 'jpeg'):
        raise ValueError(f'image_format: {image_format!r} not in png/jpeg')
    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f'rgb: expected (H, W, 3) uint8, got {rgb.shape} {rgb.dtype}')
    params = [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)] if image_format == 'jpeg' else []
    is_ok, encoded = cv2.imencode('.' + ('jpg' if image_format == 'jpeg' else 'png'),
                                  cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params)
    if not is_ok:  # pragma: no cover
        raise ValueError('rgb: OpenCV could not encode the image')
    msg = CompressedImage()
    if stamp is not None:
        msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.format = f'rgb8; {image_format} compressed bgr8'
    msg.data = encoded.tobytes()
    return msg


__all__ = ['SUPPORTED_ENCODINGS', 'image_to_rgb', 'compressed_to_rgb', 'model_rgb',
           'array_to_image', 'rgb_to_image', 'rgb_to_compressed']
