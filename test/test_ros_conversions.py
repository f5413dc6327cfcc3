"""Image / CompressedImage -> RGB conversions against arrays built by hand.

Expected arrays are derived independently of vla_spec_ros.image_messages: messages are
assembled byte by byte (struct / per-pixel loops) where the writer helper would otherwise be
testing itself.
"""
import importlib.util
import io
import struct

import numpy as np
import pytest

HAS_MSGS = importlib.util.find_spec('sensor_msgs') is not None
HAS_CV2 = importlib.util.find_spec('cv2') is not None
pytestmark = pytest.mark.skipif(not HAS_MSGS, reason='sensor_msgs (ROS 2 message wheels) '
                                'not installed')

if HAS_MSGS:
    from sensor_msgs.msg import CompressedImage, Image

    from vla_spec_ros import image_messages as conversions
    from vla_spec_ros.image_messages import array_to_image, compressed_to_rgb, image_to_rgb

H, W = 5, 7


def _rgb():
    rng = np.random.default_rng(3)
    return rng.integers(0, 256, (H, W, 3), dtype=np.uint8)


def _manual_message(encoding, height, width, pixel_bytes, padding, is_bigendian=0):
    """Assemble Image bytes row by row: pixel_bytes(r, c) -> bytes of one pixel."""
    rows = []
    for r in range(height):
        row = b''.join(pixel_bytes(r, c) for c in range(width))
        rows.append(row + b'\xcd' * padding)
    msg = Image()
    msg.height, msg.width, msg.encoding = height, width, encoding
    msg.is_bigendian = is_bigendian
    msg.step = len(rows[0])
    msg.data = b''.join(rows)
    return msg


@pytest.mark.parametrize('padding', [0, 3])
def test_bgr8_padded_built_by_hand(padding):
    rgb = _rgb()
    msg = _manual_message('bgr8', H, W, lambda r, c: bytes([rgb[r, c, 2], rgb[r, c, 1],
                                                           rgb[r, c, 0]]), padding)
    out = image_to_rgb(msg)
    assert out.dtype == np.uint8 and out.shape == (H, W, 3)
    np.testing.assert_array_equal(out, rgb)


def test_rgba8_and_bgra8_drop_alpha_built_by_hand():
    rgb = _rgb()
    alpha = 77
    rgba = _manual_message('rgba8', H, W, lambda r, c: bytes(list(rgb[r, c]) + [alpha]), 1)
    bgra = _manual_message('bgra8', H, W, lambda r, c: bytes(list(rgb[r, c, ::-1]) + [alpha]),
                           5)
    np.testing.assert_array_equal(image_to_rgb(rgba), rgb)
    np.testing.assert_array_equal(image_to_rgb(bgra), rgb)


def test_mono8_replicates_gray_built_by_hand():
    gray = _rgb()[:, :, 0]
    msg = _manual_message('mono8', H, W, lambda r, c: bytes([gray[r, c]]), 2)
    out = image_to_rgb(msg)
    for ch in range(3):
        np.testing.assert_array_equal(out[:, :, ch], gray)


@pytest.mark.parametrize('with_cv2', [True, False], ids=['opencv', 'integers'])
@pytest.mark.parametrize('channels', [1, 3, 4])
@pytest.mark.parametrize('byte_order', ['<', '>'])
def test_every_16_bit_value_scales_as_round_v_over_257(monkeypatch, byte_order, channels,
                                                       with_cv2):
    """The 16 -> 8 bit scaling (OpenCV's, or integer arithmetic without it) against the plain
    reference, round(v / 257) in float64, over all 65536 values in both byte orders, laid
    out as images of 1, 3 and 4 channels."""
    if with_cv2 and not HAS_CV2:
        pytest.skip('needs opencv-python-headless')
    if not with_cv2:
        monkeypatch.setattr(conversions, 'cv2', None)
    values = np.arange(65536, dtype=np.uint16).astype(byte_order + 'u2')
    values = np.random.default_rng(channels).permutation(np.tile(values, channels))
    image = values.reshape(-1, 256, channels)
    reference = np.rint(image.astype(np.float64) / 257.0).astype(np.uint8)
    out = conversions._to_uint8(image)
    assert out.dtype == np.uint8 and out.shape == image.shape
    np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize('is_bigendian', [0, 1])
def test_mono16_respects_byte_order(is_bigendian):
    values = np.array([[0, 257, 65535], [128, 129 * 257, 40000]], dtype=np.int64)
    fmt = '>H' if is_bigendian else '<H'
    msg = _manual_message('mono16', 2, 3, lambda r, c: struct.pack(fmt, int(values[r, c])), 4,
                          is_bigendian)
    out = image_to_rgb(msg)
    # 16 -> 8 bits: round(v / 257), computed here with integer arithmetic.
    expected = (values * 2 + 257) // (2 * 257)
    np.testing.assert_array_equal(out[:, :, 0], expected)
    np.testing.assert_array_equal(out[:, :, 2], expected)
    assert expected[0].tolist() == [0, 1, 255]


def test_rgb16_big_endian_channel_order():
    msg = _manual_message('rgb16', 1, 2, lambda r, c: struct.pack('>HHH', 257 * 10, 257 * 20,
                                                                  257 * (30 + c)), 0, 1)
    out = image_to_rgb(msg)
    assert out.tolist() == [[[10, 20, 30], [10, 20, 31]]]


@pytest.mark.parametrize('encoding', ['rgb8', 'bgr8', 'rgba8', 'bgra8', 'mono8'])
@pytest.mark.parametrize('padding', [0, 9])
def test_writer_round_trip_every_encoding(encoding, padding):
    rgb = _rgb()
    layouts = {'rgb8': rgb, 'bgr8': rgb[:, :, ::-1],
               'rgba8': np.dstack([rgb, np.full((H, W), 200, np.uint8)]),
               'bgra8': np.dstack([rgb[:, :, ::-1], np.full((H, W), 9, np.uint8)]),
               'mono8': rgb[:, :, 1]}
    msg = array_to_image(layouts[encoding], encoding, row_padding=padding)
    channels = 1 if encoding == 'mono8' else len(encoding) - 1
    assert msg.step == W * channels + padding
    assert len(msg.data) == msg.step * H
    expected = np.dstack([rgb[:, :, 1]] * 3) if encoding == 'mono8' else rgb
    np.testing.assert_array_equal(image_to_rgb(msg), expected)


@pytest.mark.parametrize('is_bigendian', [False, True])
def test_writer_16_bit_byte_order(is_bigendian):
    values = np.array([[[0, 257, 65535], [514, 1000, 60000]]], dtype=np.uint16)   # (1, 2, 3)
    msg = array_to_image(values[:, :, ::-1], 'bgr16', is_bigendian=is_bigendian, row_padding=2)
    assert msg.is_bigendian == int(is_bigendian) and msg.step == 2 * 3 * 2 + 2
    first = bytes(msg.data[:2])          # B of pixel 0 is 65535 -> 0xFFFF either way
    assert first == b'\xff\xff'
    second = bytes(msg.data[6:8])        # B of pixel 1 is 60000 = 0xEA60
    assert second == (b'\xea\x60' if is_bigendian else b'\x60\xea')
    out = image_to_rgb(msg)
    assert out.tolist() == [[[0, 1, 255], [2, 4, 233]]]     # round(v / 257)


def test_output_does_not_alias_the_message_buffer():
    rgb = _rgb()
    msg = array_to_image(rgb, 'rgb8')
    out = image_to_rgb(msg)
    out[:] = 0
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


def test_bad_messages_name_the_field():
    msg = array_to_image(_rgb(), 'rgb8')
    msg.encoding = 'yuv422'
    with pytest.raises(ValueError, match='encoding'):
        image_to_rgb(msg)
    msg = array_to_image(_rgb(), 'rgb8')
    msg.step = W * 3 - 1
    with pytest.raises(ValueError, match='step'):
        image_to_rgb(msg)
    msg = array_to_image(_rgb(), 'rgb8')
    msg.data = bytes(W * 3 * H - 1)
    with pytest.raises(ValueError, match='data'):
        image_to_rgb(msg)
    with pytest.raises(ValueError, match='array'):
        array_to_image(_rgb(), 'mono8')


@pytest.mark.parametrize('padding', [1, 4, 64])
def test_an_installed_cv_bridge_is_not_used(monkeypatch, padding):
    """cv_bridge's imgmsg_to_cv2 reads a row as step / channels pixels: a padding that is not
    a whole number of pixels sheared the image and swapped its colours, and the node acted on
    it (it was used for 8-bit images wherever it was installed, which is every ROS install;
    here it is not installable, so the test puts a stand-in that must not be called)."""
    import importlib
    import sys
    import types

    class RefusingBridge:
        def imgmsg_to_cv2(self, *args, **kwargs):
            raise AssertionError('cv_bridge was used to convert an image')

    monkeypatch.setitem(sys.modules, 'cv_bridge', types.SimpleNamespace(CvBridge=RefusingBridge))
    reloaded = importlib.reload(conversions)
    try:
        rgb = _rgb()
        for encoding, pixel in (('rgb8', lambda r, c: bytes(rgb[r, c])),
                                ('bgr8', lambda r, c: bytes(rgb[r, c, ::-1]))):
            msg = _manual_message(encoding, H, W, pixel, padding)
            np.testing.assert_array_equal(reloaded.image_to_rgb(msg), rgb)
    finally:
        monkeypatch.delitem(sys.modules, 'cv_bridge')
        importlib.reload(conversions)


# ---- compressed -----------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_CV2, reason='opencv-python-headless not installed')
class TestCompressed:
    def _gradient(self):
        # Smooth content so that JPEG's error stays small.
        y, x = np.mgrid[0:32, 0:48]
        return np.dstack([x * 5, y * 7, (x + y) * 3]).astype(np.uint8)

    def test_png_is_exact(self):
        rgb = _rgb()
        msg = conversions.rgb_to_compressed(rgb, 'png')
        assert bytes(msg.data[1:4]) == b'PNG'
        np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)

    def test_jpeg_is_close(self):
        rgb = self._gradient()
        msg = conversions.rgb_to_compressed(rgb, 'jpeg', quality=95)
        assert bytes(msg.data[:2]) == b'\xff\xd8'     # JPEG SOI marker
        out = compressed_to_rgb(msg)
        assert out.shape == rgb.shape and out.dtype == np.uint8
        assert np.abs(out.astype(int) - rgb.astype(int)).mean() < 2.0
        # Channel order kept: red grows along x, green along y.
        assert out[0, -1, 0] > out[0, 0, 0] + 100 and out[-1, 0, 1] > out[0, 0, 1] + 100

    def _textured(self, shape=(47, 63, 3)):
        import cv2
        noise = np.random.default_rng(4).integers(0, 256, shape, dtype=np.uint8)
        return cv2.GaussianBlur(noise, (7, 7), 2)

    @staticmethod
    def _jpeg(image, **options):
        from PIL import Image as PILImage
        buffer = io.BytesIO()
        PILImage.fromarray(image).save(buffer, 'JPEG', **options)
        return CompressedImage(format='jpeg', data=buffer.getvalue())

    @pytest.mark.parametrize('options', [{'quality': 90}, {'quality': 80, 'subsampling': 0},
                                         {'quality': 85, 'progressive': True}, {'mode': 'L'},
                                         {'mode': 'CMYK'}])
    def test_jpeg_pixels_are_opencvs(self, options):
        """The strict decoder gives exactly the pixels cv2.imdecode (+ BGR to RGB) gives, for
        4:2:0, 4:4:4, progressive, gray and CMYK JPEGs (CMYK: checked, then OpenCV's)."""
        import cv2
        options = dict(options)
        image = self._textured()
        mode = options.pop('mode', None)
        if mode == 'L':
            image = image[:, :, 0].copy()
        msg = self._jpeg(image, **options) if mode != 'CMYK' else None
        if mode == 'CMYK':
            from PIL import Image as PILImage
            buffer = io.BytesIO()
            PILImage.fromarray(image).convert('CMYK').save(buffer, 'JPEG')
            msg = CompressedImage(format='jpeg', data=buffer.getvalue())
        decoded = cv2.imdecode(np.frombuffer(bytes(msg.data), np.uint8), cv2.IMREAD_COLOR)
        np.testing.assert_array_equal(compressed_to_rgb(msg),
                                      cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB))

    def test_a_damaged_or_truncated_jpeg_is_refused(self):
        """Bytes overwritten in the middle of a JPEG (a lossy link, a driver's buffer reused
        too early) or its end cut off: OpenCV decodes both to smeared blocks and returns them;
        they are refused, naming the damage. A damage that still reads as valid entropy data
        cannot be told (here 8 of 20 random 8-byte damages are refused, OpenCV refused none;
        the rest decode with a mean error of about 3 levels)."""
        msg = self._jpeg(self._textured((128, 128, 3)), quality=90)
        data = bytes(msg.data)
        rng = np.random.default_rng(11)
        refused = 0
        for _ in range(20):
            damaged = bytearray(data)
            at = int(rng.integers(len(data) // 4, 3 * len(data) // 4))
            damaged[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
            try:
                compressed_to_rgb(CompressedImage(format='jpeg', data=bytes(damaged)))
            except ValueError as exc:
                assert 'damaged JPEG' in str(exc)
                refused += 1
        assert refused >= 5, refused
        with pytest.raises(ValueError, match='damaged JPEG'):
            compressed_to_rgb(CompressedImage(format='jpeg', data=data[:len(data) // 2]))

    def test_gray_and_bgra_png(self):
        import cv2

        rgb = _rgb()
        gray = rgb[:, :, 0].copy()
        msg = CompressedImage(format='mono8; png compressed')
        msg.data = cv2.imencode('.png', gray)[1].tobytes()
        np.testing.assert_array_equal(compressed_to_rgb(msg), np.dstack([gray] * 3))
        bgra = np.dstack([rgb[:, :, ::-1], np.full((H, W), 128, np.uint8)])
        msg.data = cv2.imencode('.png', bgra)[1].tobytes()
        np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)

    def test_corrupt_data_raises(self):
        msg = CompressedImage(format='jpeg')
        msg.data = b'\x00\x01not an image'
        with pytest.raises(ValueError, match='data'):
            compressed_to_rgb(msg)
        msg.data = b''
        with pytest.raises(ValueError, match='data'):
            compressed_to_rgb(msg)

    @pytest.mark.parametrize('fmt', ['.hdr', '.tiff'])
    def test_a_float_image_is_refused_not_turned_black(self, fmt):
        """A float HDR or TIFF decoded to float32 was scaled as 16-bit (/ 257) into an
        all-black image and given to the model as a valid frame."""
        import cv2
        msg = CompressedImage(format=fmt[1:])
        msg.data = cv2.imencode(fmt, np.full((8, 8, 3), 0.5, np.float32))[1].tobytes()
        with pytest.raises(ValueError, match='float32 pixels'):
            compressed_to_rgb(msg)

    @pytest.mark.parametrize('fmt', ['.png', '.jpg'])
    def test_a_size_the_model_refuses_is_refused_from_the_header_before_decoding(
            self, monkeypatch, fmt):
        """A few hundred kilobytes of PNG or JPEG can decode to gigabytes: a side outside
        [2, MAX_IMAGE_SIDE] is refused from the file header, and OpenCV never decodes it."""
        import cv2

        from vla_spec_ros import image_messages
        from vla_spec_ros.image_check import MAX_IMAGE_SIDE
        side = MAX_IMAGE_SIDE + 8
        msg = CompressedImage(format=fmt[1:])
        msg.data = cv2.imencode(fmt, np.zeros((2, side, 3), np.uint8))[1].tobytes()
        assert image_messages.header_size(bytes(msg.data)) == (side, 2)

        def no_decoding(*args):
            raise AssertionError('decoded an image refused by its header')
        monkeypatch.setattr(image_messages.cv2, 'imdecode', no_decoding)
        with pytest.raises(ValueError, match=f'image size {side}x2 \\(from its header'):
            compressed_to_rgb(msg)
        # A header Pillow does not read leaves the verdict to the decoder.
        assert image_messages.header_size(b'\x00\x01not an image') is None

    def test_a_header_past_pillows_bomb_limit_is_refused_not_decoded(self, monkeypatch):
        """Above its decompression-bomb limit Pillow will not open an image at all: that is
        a refusal too, not a reason to let OpenCV decode gigabytes."""
        import struct
        import zlib

        from vla_spec_ros import image_messages
        side = 15000                               # 225M pixels: past Pillow's limit

        def chunk(kind, body):
            return (struct.pack('>I', len(body)) + kind + body
                    + struct.pack('>I', zlib.crc32(kind + body)))
        header = struct.pack('>IIBBBBB', side, side, 8, 2, 0, 0, 0)   # 8-bit RGB
        png = (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header)
               + chunk(b'IDAT', zlib.compress(b'')) + chunk(b'IEND', b''))

        def no_decoding(*args):
            raise AssertionError('decoded an image refused by its header')
        monkeypatch.setattr(image_messages.cv2, 'imdecode', no_decoding)
        msg = CompressedImage(format='png')
        msg.data = png
        with pytest.raises(ValueError, match='height/width: .*from its header'):
            compressed_to_rgb(msg)


@pytest.mark.parametrize('with_cv2', [True, False], ids=['opencv', 'numpy'])
def test_channel_selection_equals_the_fancy_index_for_every_layout(monkeypatch, with_cv2):
    """rgb_channels (OpenCV's conversion, or one copy per channel without it) gives exactly
    ``pixels[:, :, list(order)]`` for every layout, on random sizes and on padded
    (non-contiguous) rows, as a fresh C-contiguous array."""
    if with_cv2 and not HAS_CV2:
        pytest.skip('needs opencv-python-headless')
    if not with_cv2:
        monkeypatch.setattr(conversions, 'cv2', None)
    rng = np.random.default_rng(11)
    layouts = {(channels, order) for channels, _, order in conversions._LAYOUTS.values()}
    for channels, order in sorted(layouts):
        for _ in range(5):
            height, width = (int(v) for v in rng.integers(1, 60, 2))
            padded = rng.integers(0, 256, (height, width + 3, channels), dtype=np.uint8)
            for pixels in (padded[:, :width], np.ascontiguousarray(padded[:, :width])):
                out = conversions.rgb_channels(pixels, order)
                assert out.shape == (height, width, 3) and out.dtype == np.uint8
                assert out.flags['C_CONTIGUOUS'] and not np.shares_memory(out, pixels)
                np.testing.assert_array_equal(out, pixels[:, :, list(order)])
