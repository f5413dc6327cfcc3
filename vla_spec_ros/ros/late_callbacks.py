"""Executor callbacks that may run after their entities were destroyed.

A timer's or subscription's callback that an executor thread has already started, and the
done-callback of a service or action future (queued as an executor task whatever happens to
the client), can run after ``destroy()`` (the node's shutdown, a managed node's cleanup) has
destroyed the publishers and clients it uses. rclpy then raises ``InvalidHandle``, and an
executor that keeps spinning (the node's own under a lifecycle transition, a test graph's)
re-raises the failed task on every spin. Such a callback has nothing left to do: its outputs
are gone. ``tolerating_destroyed`` wraps a callback so that this one error ends it quietly;
every other error still propagates.

Contract: only callbacks whose every effect goes through the node's entities are wrapped
(publishing, calling services, sending goals), so ending one early loses nothing that
still exists. The wrapper keeps the callback's signature (rclpy reads it to choose whether a
subscription callback gets the message info).
"""
from __future__ import annotations

import functools

from rclpy._rclpy_pybind11 import InvalidHandle


def tolerating_destroyed(callback):
    """``callback``, ending quietly where an entity it uses was destroyed under it."""
    @functools.wraps(callback)
    def run(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except InvalidHandle:
            return None
    return run
