"""A stop signal that comes before the node's own handler is in place ends the process with 0.

`python3 -m vla_spec_ros.ros.node` (`ros2 run`, the launch files) and the `vla-spec-node`
scripts first import rclpy, OpenCV and the node's modules (about 0.3 s on the 2-core
development machine); `run` (ros/node.py) installs its handler only after that. A SIGINT or
SIGTERM meanwhile (a launch stopped right after it started) met Python's defaults: a
KeyboardInterrupt traceback and exit status -2, or -15. Nothing was published yet, so the
process now exits 0, as for a signal during the model's load (docs/node.md, "Stopping the
node"). Imported first by node.py and lifecycle_node.py for this side effect; it acts only
when one of them is the program, never in a test or an application that imports them (their
handlers stay theirs).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

ENTRY_MODULES = ('vla_spec_ros.ros.node', 'vla_spec_ros.ros.lifecycle_node')
ENTRY_SCRIPTS = ('vla-spec-node', 'vla-spec-lifecycle-node')
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


_received: list[str] = []      # the stop signals that came while these handlers were in place


def _exit_0(number, frame) -> None:
    _received.append(signal.Signals(number).name)
    raise SystemExit(0)


def received() -> str | None:
    """The first stop signal that came before `run` took over, or None. SystemExit raised
    where Python swallows it (a garbage-collector callback: "Exception ignored") leaves the
    imports going on; `run` then ends at once with 0 on this record (ros/node.py)."""
    return _received[0] if _received else None


def is_entry_point() -> bool:
    """Whether the program is the node: `python3 -m` one of ENTRY_MODULES, or a script."""
    spec = getattr(sys.modules.get('__main__'), '__spec__', None)
    if spec is not None and spec.name in ENTRY_MODULES:
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in ENTRY_SCRIPTS


def install() -> bool:
    """Python's default stop handlers replaced by an exit with 0, for the node's program only;
    whether they were."""
    if not is_entry_point() or threading.current_thread() is not threading.main_thread():
        return False
    for number in STOP_SIGNALS:
        if signal.getsignal(number) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(number, _exit_0)
    return True


install()

__all__ = ['install', 'is_entry_point', 'received']
