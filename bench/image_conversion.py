"""What the node's image conversion costs on the worker every robot shares: sensor_msgs/Image
-> the model's (H, W, 3) uint8 RGB (image_messages.model_rgb) for each encoding and size,
against the plain conversion it replaced (the channels picked by a numpy fancy index, 16-bit
values scaled in integers: the references the tests compare with), measured in the same run,
interleaved rounds, medians. Every row checks that both give the same pixels.

    python3 bench/image_conversion.py --sizes 640x480,1920x1080,4000x3000 --rounds 5
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reference_rgb(msg) -> np.ndarray:
    """The conversion before it was sped up: the same unpacking, the channels picked by a
    fancy index, 16-bit values scaled as floor((v + 128) / 257) in integers."""
    from vla_spec_ros import image_messages as im

    channels, depth, order = im._LAYOUTS[msg.encoding]
    step, height, width = msg.step, msg.height, msg.width
    rows = np.frombuffer(msg.data, dtype=np.uint8)[:step * height].reshape(height, step)
    rows = rows[:, :width * channels * depth]
    if depth == 2:
        dtype = np.dtype('>u2') if msg.is_bigendian else np.dtype('<u2')
        pixels = np.ascontiguousarray(rows).view(dtype).reshape(height, width, channels)
    else:
        pixels = rows.reshape(height, width, channels)
    rgb = pixels[:, :, list(order)]
    if depth == 2:
        rgb = ((rgb.astype(np.uint32) + 128) // 257).astype(np.uint8)
    return np.ascontiguousarray(rgb)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--sizes', default='640x480,1920x1080,4000x3000')
    parser.add_argument('--encodings', default='rgb8,bgr8,bgra8,mono8,rgb16')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--repeats', type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        parser.error('--rounds and --repeats must be >= 1')
    from vla_spec_ros.image_messages import _LAYOUTS, array_to_image, model_rgb

    rng = np.random.default_rng(0)
    rows = []
    for size in args.sizes.split(','):
        width, height = (int(v) for v in size.split('x'))
        for encoding in args.encodings.split(','):
            channels, depth, _ = _LAYOUTS[encoding]
            dtype = np.uint8 if depth == 1 else np.uint16
            array = rng.integers(0, np.iinfo(dtype).max, (height, width, channels), dtype=dtype)
            msg = array_to_image(array[:, :, 0] if channels == 1 else array, encoding)
            if not np.array_equal(model_rgb(msg), reference_rgb(msg)):
                raise SystemExit(f'{encoding} {size}: the conversions differ')
            rows.append((size, encoding, msg, [], []))
    for _ in range(args.rounds):                 # interleaved: both sides see the same noise
        for _, _, msg, fast, plain in rows:
            fast.append(median_ms(lambda: model_rgb(msg), args.repeats))
            plain.append(median_ms(lambda: reference_rgb(msg), args.repeats))
    print(f'# Image conversion on the worker ({time.strftime("%Y-%m-%d %H:%M:%S")})\n')
    print(f'command: `python3 bench/image_conversion.py {" ".join(sys.argv[1:])}`\n')
    print('| size | encoding | model_rgb ms | fancy-index reference ms | ×reference |')
    print('|---|---|---|---|---|')
    for size, encoding, _, fast, plain in rows:
        f, p = float(np.median(fast)), float(np.median(plain))
        print(f'| {size} | {encoding} | {f:.2f} | {p:.2f} | {f / p:.2f} |')


if __name__ == '__main__':
    main()
