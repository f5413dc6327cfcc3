"""A node started by a launch file stops when that launch process ends (ros/parent_exit.py):
real processes, no ROS. A child asked to watch its parent gets SIGTERM when the parent ends;
one whose parent had ended before it asked gets SIGTERM at once; without the variable nothing
changes; a malformed value is reported, not acted on."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vla_spec_ros.ros.parent_exit import PARENT_PID_ENV, stop_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'),
                                reason='PR_SET_PDEATHSIG is Linux only')

# The child: watches its parent, prints its pid and what was done, then waits for a signal.
CHILD = textwrap.dedent('''
    import os, sys, time
    from vla_spec_ros.ros.parent_exit import stop_with_parent
    said = stop_with_parent()
    print(os.getpid(), said, flush=True)
    time.sleep(120)
''')
# The parent: starts the child with its own pid in the variable, passes on the child's line,
# then ends without waiting for it.
PARENT = textwrap.dedent('''
    import os, subprocess, sys
    env = dict(os.environ, VLA_SPEC_PARENT_PID=str(os.getpid()))
    child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=env,
                             stdout=subprocess.PIPE, text=True)
    print(child.stdout.readline().strip(), flush=True)
''')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f'/proc/{pid}/stat') as handle:        # a zombie has ended too
        return handle.read().split(')')[-1].split()[0] != 'Z'


def test_the_child_ends_when_its_launching_parent_ends():
    parent = subprocess.run([sys.executable, '-c', PARENT, CHILD], capture_output=True,
                            text=True, timeout=60)
    line = parent.stdout.strip()
    pid_text, _, said = line.partition(' ')
    assert said.startswith('stops when the launching process'), (line, parent.stderr)
    child = int(pid_text)
    deadline = time.monotonic() + 30.0
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail('the child outlived its parent by 30 s')


def test_a_parent_already_gone_ends_the_child_at_once():
    env = dict(os.environ, **{PARENT_PID_ENV: str(os.getpid() + 1_000_000)})
    result = subprocess.run([sys.executable, '-c', CHILD], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == -signal.SIGTERM, result


def test_nothing_is_asked_without_the_variable_and_a_bad_value_is_reported():
    assert stop_with_parent({}) is None
    assert stop_with_parent({PARENT_PID_ENV: ' '}) is None
    assert 'is not a process id' in stop_with_parent({PARENT_PID_ENV: 'launch'})
