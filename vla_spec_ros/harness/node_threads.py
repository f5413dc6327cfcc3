"""Nodes of one process spun as if each group were a process of its own.

The harnesses put the VLA node and its peers (a simulator bridge, a camera) in one process and
one rclpy Context. In a deployment they are separate processes, each spun by a single-threaded
executor (`rclpy.spin`). `NodeThreads` keeps that shape: every group of nodes gets its own
SingleThreadedExecutor on its own thread, so a peer's callback (a simulator step, a render)
never delays the VLA node's callbacks and the reverse.

Why not one MultiThreadedExecutor over all nodes (what the harnesses did before): with two
robots at 30 Hz, a two-thread MultiThreadedExecutor on the receiving side delivered twists up to
0.45 s after the node had published them (the node's own stamp -> publish age was at most
85 ms), and the harness then measured that delay as the node's latency and its tails.

Teardown order is the contract: every executor is shut down and its thread joined before any
node is destroyed (a callback still running against a destroyed node fails, and its future
reports the error on stderr at exit).
"""
from __future__ import annotations

import threading


class NodeThreads:
    """`groups`: lists of nodes of one Context; each list is spun by its own executor."""

    def __init__(self, context, groups, name: str = 'node_threads'):
        from rclpy.executors import SingleThreadedExecutor

        self._executors, self._threads = [], []
        for index, nodes in enumerate(groups):
            if not nodes:
                raise ValueError(f'groups[{index}]: expected at least one node')
            executor = SingleThreadedExecutor(context=context)
            for node in nodes:
                executor.add_node(node)
            self._executors.append(executor)
        for index, executor in enumerate(self._executors):
            thread = threading.Thread(target=executor.spin, name=f'{name}_{index}', daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop every executor and join its thread (idempotent)."""
        for executor in self._executors:
            executor.shutdown()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._executors, self._threads = [], []


__all__ = ['NodeThreads']
