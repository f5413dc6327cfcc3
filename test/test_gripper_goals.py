"""GripperActionOutput's goal bookkeeping (gripper_action.py) with a fake action client: a goal
is sent when the position changes, and sent again with the next command for it when it did not
do its work (rejected, aborted, lost to a server that went away) or after a hold; its fate is in
/diagnostics. The DDS test with a real ActionServer is test_gripper_action.py."""
import importlib.util
from types import SimpleNamespace

import pytest

from fake_node import RecordingNode

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ('rclpy', 'action_msgs', 'diagnostic_msgs')),
    reason='needs rclpy, action_msgs and diagnostic_msgs')


class _Future:
    def __init__(self, value=None, error=None):
        self.value, self.error, self.callbacks = value, error, []

    def add_done_callback(self, callback):
        self.callbacks.append(callback)

    def finish(self):
        for callback in self.callbacks:
            callback(self)

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


class _Client:
    """A fake ActionClient: every goal sent is kept with its response future."""

    def __init__(self):
        self.ready, self.goals = True, []

    def server_is_ready(self):
        return self.ready

    def send_goal_async(self, goal):
        self.goals.append((goal, _Future()))
        return self.goals[-1][1]


class _Goal:
    def __init__(self):
        self.command = SimpleNamespace(position=None, max_effort=None)


def _output(monkeypatch):
    """A GripperActionOutput on the fake client: the real constructor, as where control_msgs
    is missing (whether it is installed or not), then the fake client and action type."""
    from vla_spec_ros.ros import gripper_action

    def missing(kind):
        raise ImportError('control_msgs (not used by these tests)')
    monkeypatch.setattr(gripper_action, '_action_type', missing)
    node = RecordingNode(0.0)
    warnings = node.warnings
    output = gripper_action.GripperActionOutput(node, '/gripper_cmd', 'gripper_command',
                                                'robot')
    assert output.client is None
    output.client = _Client()
    output._type = SimpleNamespace(Goal=_Goal, __name__='GripperCommand')
    warnings.clear()
    return output, warnings


SETTINGS = SimpleNamespace(gripper_max_effort=5.0, gripper_joint_name='')


def _accept(future, status):
    """The server accepts the goal of `future`, then ends it with `status`."""
    result = _Future(SimpleNamespace(status=status))
    future.value = SimpleNamespace(accepted=True, get_result_async=lambda: result)
    future.finish()
    result.finish()


def test_a_goal_is_sent_when_the_position_changes_and_its_fate_is_reported(
        monkeypatch):
    from action_msgs.msg import GoalStatus
    output, warnings = _output(monkeypatch)
    output.send(0.04, SETTINGS)
    output.send(0.04, SETTINGS)
    assert len(output.client.goals) == 1
    goal, future = output.client.goals[0]
    assert goal.command.position == 0.04 and goal.command.max_effort == 5.0
    _accept(future, GoalStatus.STATUS_SUCCEEDED)
    assert output.state == 'goal 0.0400 succeeded' and warnings == []
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 2


@pytest.mark.parametrize('fate', ['rejected', 'aborted', 'lost'])
def test_a_goal_that_did_not_do_its_work_is_sent_again_with_the_next_command(
        fate, monkeypatch):
    """Before, the position was remembered as sent whatever happened to the goal, so a
    rejected, aborted or lost goal was never sent again while the model asked for it."""
    from action_msgs.msg import GoalStatus
    output, warnings = _output(monkeypatch)
    output.send(0.0, SETTINGS)
    _, future = output.client.goals[0]
    if fate == 'rejected':
        future.value = SimpleNamespace(accepted=False)
        future.finish()
    elif fate == 'aborted':
        _accept(future, GoalStatus.STATUS_ABORTED)
    else:
        future.error = RuntimeError('the server went away')
        future.finish()
    expected = 'rejected' if fate == 'lost' else fate
    assert output.state == f'goal 0.0000 {expected}'
    assert warnings and 'sent again with the next command' in warnings[-1]
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 2


def test_a_server_that_went_away_gets_the_goal_again_when_it_is_back(monkeypatch):
    from action_msgs.msg import GoalStatus
    output, _ = _output(monkeypatch)
    output.send(0.0, SETTINGS)
    _accept(output.client.goals[0][1], GoalStatus.STATUS_SUCCEEDED)
    output.client.ready = False                     # killed: the command finds it missing
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 1 and 'not ready' in output.state
    output.client.ready = True                      # respawned: it knows no goal of ours
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 2


def test_after_a_hold_the_next_goal_goes_out_whatever_the_last_one_was(monkeypatch):
    from action_msgs.msg import GoalStatus
    from diagnostic_msgs.msg import DiagnosticStatus
    from vla_spec_ros.ros.gripper_output import GripperOutput

    output, _ = _output(monkeypatch)
    gripper = GripperOutput.__new__(GripperOutput)
    gripper.action_client = output
    output.send(0.04, SETTINGS)
    _accept(output.client.goals[0][1], GoalStatus.STATUS_SUCCEEDED)
    gripper.hold(None, SETTINGS)                    # e.g. deactivated, then teleoperated
    output.send(0.04, SETTINGS)
    assert len(output.client.goals) == 2
    status = DiagnosticStatus()
    gripper.add_to_status(status)
    assert [(v.key, v.value) for v in status.values] == [('gripper_action', 'goal 0.0400 sent')]
