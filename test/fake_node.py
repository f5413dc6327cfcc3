"""A stand-in for the little of an rclpy Node an output or input adapter uses, on a clock the
test sets: unit tests of the adapters' rules without DDS (the DDS tests use real nodes)."""
from types import SimpleNamespace


class FakeClock:
    """A node clock at `now_s` (seconds), moved by the test."""

    def __init__(self, now_s: float):
        self.now_s = now_s

    def now(self):
        from rclpy.time import Time
        return Time(nanoseconds=round(self.now_s * 1e9))


class RecordingNode:
    """get_clock, get_logger (warnings kept), create_publisher (every message kept, in
    `sent` as (clock seconds, message) and in `published` as (topic, message); each reports
    `subscription_count` matched subscriptions) and
    create_subscription (its callback in `callbacks`, by topic)."""

    def __init__(self, now_s: float):
        self.clock, self.sent, self.published = FakeClock(now_s), [], []
        self.subscription_count = 1        # what every publisher reports as matched
        self.callbacks, self.warnings = {}, []

    def get_clock(self):
        return self.clock

    def get_logger(self):
        return SimpleNamespace(warning=lambda text, **kwargs: self.warnings.append(text))

    def create_subscription(self, msg_type, topic, callback, qos):
        self.callbacks[topic] = callback

    def create_publisher(self, msg_type, topic, qos):
        node = self

        class Publisher:
            topic_name = topic

            def publish(self, msg):
                node.sent.append((node.clock.now_s, msg))
                node.published.append((topic, msg))

            def get_subscription_count(self):
                return node.subscription_count
        return Publisher()

    def on(self, topic_end: str):
        """The callback of the one subscription whose topic ends with `topic_end`."""
        (callback,) = [c for topic, c in self.callbacks.items() if topic.endswith(topic_end)]
        return callback
