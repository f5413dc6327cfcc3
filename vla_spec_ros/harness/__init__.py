"""Harnesses above both `ros/` and `sim/`: the simulator bridge node, the ROS 2 closed loop
(a `vla_spec` node and a bridge node in one process) and the `vla-spec demo` job.

Import direction: harness -> ros, sim, policy; nothing below imports harness (see
docs/architecture.md and test/test_import_graph.py).
"""
