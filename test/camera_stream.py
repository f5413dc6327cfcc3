"""A camera for the node's integration tests: a fresh random frame, stamped now, on each of
its topics every `period_s`, on its own thread, until `close()`, as a camera driver keeps
publishing before the node starts and while it stops."""
import threading

import numpy as np


class CameraStream:

    def __init__(self, node, topics, period_s=0.05, shape=(48, 64, 3)):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        self._node = node
        self._shape, self._period_s = shape, period_s
        self._pubs = [node.create_publisher(Image, topic, qos) for topic in topics]
        self._lock = threading.Lock()
        self.num_published = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from vla_spec_ros.image_messages import array_to_image

        rng = np.random.default_rng(0)
        while not self._stop.is_set():
            for pub in self._pubs:
                image = rng.integers(0, 256, self._shape, dtype=np.uint8)
                pub.publish(array_to_image(image, 'rgb8', frame_id='camera',
                                           stamp=self._node.get_clock().now().to_msg()))
            with self._lock:
                self.num_published += 1
            self._stop.wait(self._period_s)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        for pub in self._pubs:
            self._node.destroy_publisher(pub)
