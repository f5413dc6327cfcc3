"""The hold state machine of one robot (ros/safety_gate.py), pure Python: no rclpy, no torch.

Rules under test (the module's docstring): a hold state goes out `num_halt_messages` times on
entering it and then stays quiet; a new kind has its own budget, and kinds that alternate do
not renew each other's (until a command); a hold that must go
out always does; a command releases the state; a refused frame supersedes the results of older
frames; an instruction change supersedes results decided under the old one.
"""
from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.safety_gate import SafetyGate


def test_a_hold_state_goes_out_its_budget_then_goes_quiet():
    gate = SafetyGate()
    sent = [gate.hold_state(f'{cmd.REASON_STALE}: age {i} s', 3) for i in range(6)]
    assert sent == [True, True, True, False, False, False]


def test_a_new_kind_of_hold_starts_a_new_budget():
    gate = SafetyGate()
    assert [gate.hold_state(cmd.REASON_DISABLED, 2) for _ in range(3)] == [True, True, False]
    assert gate.hold_state(cmd.REASON_NO_INSTRUCTION, 2)
    assert gate.hold_kind == cmd.REASON_NO_INSTRUCTION


def test_alternating_kinds_do_not_renew_each_others_budget():
    # A refused future-stamped frame, then the watchdog's stale hold, again and again: each
    # kind has its budget until the next command, not one per switch.
    gate = SafetyGate()
    sent = []
    for _ in range(6):
        sent.append(gate.hold_state(f'{cmd.REASON_FUTURE}: stamp 5 s ahead', 2))
        sent.append(gate.hold_state(f'{cmd.REASON_STALE}: age 3 s', 2))
    assert sum(sent) == 4 and sent[:4] == [True, True, True, True]
    gate.released()
    assert gate.hold_state(cmd.REASON_STALE, 2)


def test_a_forced_hold_always_goes_out_even_after_the_budget():
    gate = SafetyGate()
    for _ in range(2):
        gate.hold_state(cmd.REASON_DISABLED, 2)
    assert not gate.hold_state(cmd.REASON_DISABLED, 2)
    assert all(gate.hold_now(cmd.REASON_DISABLED) for _ in range(5))


def test_a_command_releases_the_hold_state():
    gate = SafetyGate()
    assert [gate.hold_state(cmd.REASON_STALE, 1) for _ in range(2)] == [True, False]
    gate.released()
    assert gate.hold_kind is None
    assert gate.hold_state(cmd.REASON_STALE, 1)       # entering the state again: sent again


def test_a_refused_frame_supersedes_older_results_only():
    gate = SafetyGate()
    assert gate.superseded_reason(10.0, 'pick', 'pick') is None
    gate.refuse(12.0)
    assert 'refused' in gate.superseded_reason(11.9, 'pick', 'pick')
    assert gate.superseded_reason(12.0, 'pick', 'pick') is None      # the refused frame's time
    assert gate.superseded_reason(12.5, 'pick', 'pick') is None      # a newer frame
    gate.refuse(11.0)                                                  # never moves back
    assert gate.superseded_reason(11.5, 'pick', 'pick') is not None


def test_an_instruction_change_supersedes_results_under_the_old_one():
    gate = SafetyGate()
    assert 'instruction changed' in gate.superseded_reason(1.0, 'pick', 'place')
    assert 'instruction changed' in gate.superseded_reason(1.0, 'pick', '')
