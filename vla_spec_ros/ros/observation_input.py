"""One robot's observation inputs: the image subscription(s) that fill its frame slot.

The callback only stamps the message and puts it in the robot's depth-1 slot (latest wins, a
replaced one counts as dropped); conversion happens on the worker (worker.py). `newest` is the
FrameInfo of the newest image, for the watchdog's staleness check.
"""
from __future__ import annotations

import time

from sensor_msgs.msg import CompressedImage, Image

from vla_spec_ros.ros.frame_slot import FrameInfo
from vla_spec_ros.ros.qos import IMAGE_QOS


def frame_info(msg, now) -> FrameInfo:
    """The FrameInfo of an image `msg` received at `now` (rclpy Time): its header stamp, or
    the receipt time when the driver did not stamp (stamp_s stays 0.0 then)."""
    stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
    stamp = msg.header.stamp if stamp_s > 0.0 else now.to_msg()
    return FrameInfo(stamp, stamp_s, now.nanoseconds * 1e-9, time.monotonic())


class ImageInput:
    """`<prefix>image` (raw) or `<prefix>image/compressed`; `on_frame((msg, info))` gets each
    stamped image (executor thread)."""

    def __init__(self, node, prefix: str, transport: str, on_frame):
        self.node = node
        self._on_frame = on_frame
        self.newest: FrameInfo | None = None
        if transport == 'compressed':
            self._sub = node.create_subscription(CompressedImage, prefix + 'image/compressed',
                                                 self._on_image, IMAGE_QOS)
        else:
            self._sub = node.create_subscription(Image, prefix + 'image', self._on_image,
                                                 IMAGE_QOS)

    def _on_image(self, msg) -> None:
        info = frame_info(msg, self.node.get_clock().now())
        self.newest = info
        self._on_frame((msg, info))

    def destroy(self) -> None:
        self.node.destroy_subscription(self._sub)


__all__ = ['ImageInput', 'frame_info']
