"""GripperActionOutput's goal bookkeeping (gripper_action.py) with a fake action client: a goal
is sent when the position changes, and sent again with the next command for it when it did not
do its work (rejected, aborted, lost to a server that went away or to a new server instance,
unanswered too long) or after a hold; only the latest goal's end counts; its fate is in
/diagnostics. The DDS tests with a real ActionServer are test_gripper_action.py and
test_gripper_respawn.py."""
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
    assert [(v.key, v.value) for v in status.values] == [('gripper_action', 'goal 0.0400 sent'),
                                                         ('gripper_action_restarts', '0')]


def test_a_new_server_instance_gets_the_goal_again(monkeypatch):
    """A server killed outright stays listed (and ready) until its lease runs out; before,
    the respawned one never got the goal the model kept asking for."""
    from action_msgs.msg import GoalStatus
    from vla_spec_ros.ros import gripper_action

    output, warnings = _output(monkeypatch)
    output._send_goal_service = '/gripper_cmd/_action/send_goal'
    listed = {'gids': frozenset()}
    monkeypatch.setattr(gripper_action, 'server_gids', lambda node, name: listed['gids'])
    output.send(0.0, SETTINGS)                      # the graph does not list it yet
    _accept(output.client.goals[0][1], GoalStatus.STATUS_SUCCEEDED)
    listed['gids'] = frozenset({b'first'})          # listed late: not a new server
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 1 and warnings == []
    listed['gids'] = frozenset({b'first', b'respawned'})    # killed, respawned
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 2
    assert 'restarted' in output.state and 'restarted' in warnings[-1]
    _accept(output.client.goals[1][1], GoalStatus.STATUS_SUCCEEDED)
    listed['gids'] = frozenset({b'respawned'})      # the dead one's lease ran out
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 2 and output.num_restarts == 1


def test_a_goal_unanswered_too_long_is_sent_again(monkeypatch):
    from vla_spec_ros.ros import gripper_action

    output, warnings = _output(monkeypatch)
    now = {'t': 100.0}
    monkeypatch.setattr(gripper_action.time, 'monotonic', lambda: now['t'])
    output.send(0.0, SETTINGS)                      # no response ever comes
    now['t'] += gripper_action.RESULT_TIMEOUT_S
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 1
    now['t'] += 0.1
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 2 and 'unanswered' in warnings[-1]
    # The second one accepted, its result never comes: the same.
    handle = SimpleNamespace(accepted=True, get_result_async=lambda: _Future())
    future = output.client.goals[1][1]
    future.value = handle
    future.finish()
    assert output.state == 'goal 0.0000 accepted'
    now['t'] += gripper_action.RESULT_TIMEOUT_S + 0.1
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 3
    # After a hold (or the server not ready) the next goal goes out anyway: nothing awaited.
    output.forget()
    now['t'] += gripper_action.RESULT_TIMEOUT_S + 0.1
    warnings.clear()
    output.send(0.0, SETTINGS)
    assert len(output.client.goals) == 4 and warnings == []


def test_only_the_latest_goals_end_counts(monkeypatch):
    """The controller preempts a goal replaced by a newer one: its end says nothing about the
    newer one, and must not send the newer one again."""
    from action_msgs.msg import GoalStatus
    output, warnings = _output(monkeypatch)
    output.send(0.0, SETTINGS)
    output.send(0.04, SETTINGS)
    _accept(output.client.goals[0][1], GoalStatus.STATUS_CANCELED)
    assert output.state == 'goal 0.0400 sent' and warnings == []
    _accept(output.client.goals[1][1], GoalStatus.STATUS_SUCCEEDED)
    assert output.state == 'goal 0.0400 succeeded'
    output.send(0.04, SETTINGS)
    assert len(output.client.goals) == 2
