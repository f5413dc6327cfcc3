"""How long one full garbage collection stops the node's process, before and after the node
freezes what it loaded (``vla_spec_ros/ros/gc_pauses.py``).

    python bench/gc_pause.py [--model metaworld-demo]

Loads the model as the node does (``VLAPolicy.from_pretrained``), imports the node with
rclpy and its message types, runs one inference, then times ``gc.collect()`` (a full, generation
2 collection) five times, calls ``freeze_after_load`` and times five more. Prints the tracked
objects and the median and largest pause of each side. Needs the ROS 2 wheels (bash
scripts/install.sh ros).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def full_collection_ms(count: int = 5) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        gc.collect()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='metaworld-demo')
    args = parser.parse_args(argv)
    import numpy as np

    import vla_spec_ros.ros.node  # noqa: F401 - rclpy, the message types, the node's modules
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.ros.gc_pauses import freeze_after_load, unfreeze

    policy = VLAPolicy.from_pretrained(args.model, device='cpu', dtype='float32')
    size = policy.engine.runner.cfg.image_size
    frame = Frame(np.zeros((size, size, 3), np.uint8), 'pick up the cup', policy.unnorm_keys[0],
                  'gc')
    policy.engine.submit(frame)
    policy.engine.run_until_idle()
    tracked = len(gc.get_objects())
    before = full_collection_ms()
    frozen = freeze_after_load()
    after = full_collection_ms()
    unfreeze()
    print(f'`python bench/gc_pause.py --model {args.model}`: {tracked} objects tracked, '
          f'{frozen} frozen\n')
    print('| | full collection, median ms | largest ms |\n|---|---|---|')
    print(f'| as loaded | {statistics.median(before):.1f} | {max(before):.1f} |')
    print(f'| after freeze_after_load | {statistics.median(after):.2f} | {max(after):.2f} |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
