"""A node started by a launch file stops when that launch process ends, however it ends.

`ros2 launch` stops its nodes on SIGINT, but on SIGTERM (what systemd and Docker send by
default) it exits at once and leaves them running, re-parented to init: a node that goes on
commanding the robot nobody is supervising. The package's launch files put their own PID in
`PARENT_PID_ENV`; a node that finds it asks the Linux kernel for SIGTERM when its parent
ends (prctl PR_SET_PDEATHSIG), which it handles as any SIGTERM: holds last, then exit. A
parent that ended before the request took effect is caught by comparing the parent PID.

Only where a launch file asks: a node started from a shell keeps running when the shell
exits, as a user of `nohup` expects. Linux only; elsewhere the request is logged as not
available and nothing changes.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = 'VLA_SPEC_PARENT_PID'
PR_SET_PDEATHSIG = 1          # <sys/prctl.h>


def child_env() -> dict:
    """The environment a launch file adds to a node it starts, so that the node stops
    with the launch process (the calling process)."""
    return {PARENT_PID_ENV: str(os.getpid())}


def stop_with_parent(environ=None) -> str | None:
    """When `environ` (os.environ) names the parent PID, arrange SIGTERM for this process
    when that parent ends, and send it now if the parent has already gone. What was done,
    for the log, or None when nothing was asked."""
    environ = os.environ if environ is None else environ
    text = environ.get(PARENT_PID_ENV, '').strip()
    if not text:
        return None
    try:
        parent = int(text)
    except ValueError:
        return f'{PARENT_PID_ENV}={text!r} is not a process id: not watching the parent'
    if not sys.platform.startswith('linux'):
        return f'{PARENT_PID_ENV}: stopping with the parent needs Linux; not watching it'
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return f'{PARENT_PID_ENV}: prctl failed ({os.strerror(ctypes.get_errno())})'
    if os.getppid() != parent:          # it ended before the request: stop as it would
        os.kill(os.getpid(), signal.SIGTERM)
        return f'the launching process {parent} had already ended: stopping'
    return f'stops when the launching process {parent} ends'


__all__ = ['PARENT_PID_ENV', 'child_env', 'stop_with_parent']
