"""docs/fleet.md's fleet that runs anywhere, through `ros2 launch vla_spec_ros fleet.launch.py`:
two engine processes of the embedded model on the CPU (config/fleet_cpu.yaml), one robot each,
both answered; one engine SIGKILLed, launch's respawn starts it again and it answers its robot
while the other robot never stopped being answered.

The command line is docs/fleet.md's own (`$(ros2 pkg prefix ...)` expanded as a shell would),
run from the colcon install space (launch_util.colcon_workspace); the test's node publishes each
robot's instruction (latched), camera and enable, as an operator's tools would.
"""
import os
import pathlib
import signal
import time

import pytest

import launch_util
import ros2_commands
from ros2_commands import doc_commands, find_command

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLEET_DOC = ROOT / 'docs' / 'fleet.md'
DOMAIN_ID = 102 + ((os.getpid() + 5) % 19)    # test_ros2_cli: the other 102..120 values
UP_TIMEOUT = 180.0          # two engines loading on a loaded 2-core machine
TIMEOUT = 60.0
ENABLE_RETRY_S = 5.0        # an unanswered enable call is sent again after this
ENGINES = {'vla_cpu0': 'arm0', 'vla_cpu1': 'arm1'}
INSTRUCTIONS = {'arm0': 'open the drawer', 'arm1': 'push the button'}
SKIP_REASON = ros2_commands.skip_reason()

pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))


def fleet_line():
    """docs/fleet.md's launch line of the fleet that runs on any machine."""
    argv = find_command(doc_commands(FLEET_DOC), 'ros2', 'launch', 'vla_spec_ros',
                        'fleet.launch.py')
    assert argv[4].endswith('/config/fleet_cpu.yaml'), argv
    return argv


def _enable(probe, robot):
    """Call `/{robot}/enable` (true) until it answers: after a respawn a first request can be
    lost (ros_probe.call_until_answered); enabling twice is harmless."""
    from std_srvs.srv import SetBool

    from ros_probe import call_until_answered

    client = probe.create_client(SetBool, f'/{robot}/enable')
    try:
        assert client.wait_for_service(timeout_sec=TIMEOUT), f'no /{robot}/enable'
        future = call_until_answered(client, SetBool.Request(data=True), ENABLE_RETRY_S,
                                     TIMEOUT, what=f'/{robot}/enable')
        assert future.result().success, future.result().message
    finally:
        probe.destroy_client(client)


def _ready_count(launched, engine):
    return launched.output().count(f'[{engine}]: ready')


def test_docs_fleet_runs_two_engines_and_respawns_a_killed_one(tmp_path):
    from std_msgs.msg import String

    from ros_probe import ros_graph, wait_until
    from test_fleet import Cameras
    from vla_spec_ros.ros.qos import INSTRUCTION_QOS

    ws, _ = launch_util.colcon_workspace()
    ros2 = ros2_commands.Ros2(ros2_commands.cli_env(ws, DOMAIN_ID, tmp_path), ws)
    cameras = None
    with ros_graph(DOMAIN_ID, 'fleet_cli_probe', num_threads=2) as (_, _, probe):
        try:
            for robot, text in INSTRUCTIONS.items():       # latched: delivered on connect
                probe.create_publisher(String, f'/{robot}/instruction',
                                       INSTRUCTION_QOS).publish(String(data=text))
            with ros2.launch(fleet_line(), tmp_path / 'fleet.log') as launched:
                for engine in ENGINES:
                    launched.wait_for_output(rf'\[{engine}\]: ready', UP_TIMEOUT)
                pids = {engine: launched.node_pids(engine) for engine in ENGINES}
                assert all(len(p) == 1 for p in pids.values()), pids      # two processes
                for robot in ENGINES.values():
                    _enable(probe, robot)
                cameras = Cameras(probe, list(ENGINES.values()), hz=10.0)
                wait_until(lambda: all(len(cameras.actions(r)) >= 3 for r in ENGINES.values()),
                           timeout=TIMEOUT, what='both robots answered')

                os.kill(pids['vla_cpu0'][0], signal.SIGKILL)
                killed = time.monotonic()
                launched.wait_for_output(rf'process has died \[pid {pids["vla_cpu0"][0]}',
                                         TIMEOUT)
                wait_until(lambda: _ready_count(launched, 'vla_cpu0') == 2, timeout=UP_TIMEOUT,
                           what='launch to respawn vla_cpu0')
                respawned = time.monotonic()
                (new_pid,) = launched.node_pids('vla_cpu0')
                assert new_pid != pids['vla_cpu0'][0]
                # The respawned engine starts disabled (the file's enabled: false): an
                # operator enables its robot again, and it answers fresh frames.
                _enable(probe, 'arm0')
                wait_until(lambda: len(cameras.actions('arm0', since=respawned)) >= 3,
                           timeout=TIMEOUT, what='arm0 answered by the respawned engine')
                assert len(cameras.actions('arm1', since=killed)) >= 3   # never stopped
                cameras.stop()
                assert launched.interrupt() == 0, launched.output()[-4000:]
        finally:
            if cameras is not None:
                cameras.stop()
            ros2.stop_daemon()
