"""MoveIt Servo's stand-in (test/servo_double.py) in its own process, as a launch file runs
Servo: started, stopped with SIGINT, or killed with SIGKILL (a crash) and started again.

    servo = ServoProcess(env, namespace='/arm_a', timeout_s=0.1)   # waits for `ready`
    servo.wait_for(lambda e: e['event'] == 'call', what='a service call')
    servo.kill()                                                   # SIGKILL

`env`: the child's environment (ros_interfaces.node_env with the moveit_msgs prefix). Its
events (one JSON object per line: `ready`, `call`, `command`; servo_double.py's docstring) are
read on a thread and kept in order in `events`.
"""
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time

DOUBLE = pathlib.Path(__file__).resolve().parent / 'servo_double.py'
START_TIMEOUT_S = 60.0


class ServoProcess:

    def __init__(self, env, *, name='servo_node', namespace='/', timeout_s=0.1):
        self.popen = subprocess.Popen(
            [sys.executable, str(DOUBLE), '--name', name, '--namespace', namespace,
             '--timeout', str(timeout_s)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self._lock = threading.Lock()
        self.events, self.errors = [], []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_errors, daemon=True)]
        for thread in self._threads:
            thread.start()
        self.ready = self.wait_for(lambda e: e['event'] == 'ready', timeout=START_TIMEOUT_S,
                                   what=f'{namespace.rstrip("/")}/{name} ready')

    def _read(self) -> None:
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(event)

    def _read_errors(self) -> None:
        for line in self.popen.stderr:
            with self._lock:
                self.errors.append(line)

    def snapshot(self, kind=None) -> list:
        with self._lock:
            return [e for e in self.events if kind is None or e['event'] == kind]

    def find(self, predicate):
        return next((e for e in self.snapshot() if predicate(e)), None)

    def wait_for(self, predicate, timeout=30.0, what='an event'):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self.find(predicate)
            if event is not None:
                return event
            if self.popen.poll() is not None:
                time.sleep(0.1)                  # its last lines may still be on their way
                event = self.find(predicate)
                if event is not None:
                    return event
                raise AssertionError(f'Servo double exited ({self.popen.returncode}) before '
                                     f'{what}; stderr:\n{"".join(self.errors)[-3000:]}')
            time.sleep(0.01)
        raise AssertionError(f'timed out after {timeout} s waiting for {what}')

    def selections(self) -> list:
        """Its successful switch_command_type calls, in order."""
        return [e for e in self.snapshot('call')
                if e['name'] == 'switch_command_type' and e['success']]

    def kill(self) -> float:
        """SIGKILL (a crash: its DDS entries stay until their lease runs out); the time."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)
        return time.time()

    def stop(self) -> None:
        """SIGINT (a clean stop), or SIGKILL when that does not end it."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=5)
