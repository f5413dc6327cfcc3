"""The interface every paired input of a robot implements: one adapter per thing the node reads
besides its images.

A robot's observation is made by its images: observation_input.py subscribes one topic per
image slot (`image_slots`; another camera is one more name in that parameter, no code) and
pairs them by stamp. Every other input is *paired* with that observation: it keeps what it
receives and, when a set of images completes, is read at the observation's time. Its value
travels in the observation under the adapter's `key`, or its problem holds or refuses the
frame. Adding an input (a state from another source, a sensor that must be fresh before the
robot moves) is one new file with one `InputAdapter` subclass, and one line in
`robot_io.build_inputs` (as output_adapter.py does for outputs).

The contract (the base class gives the defaults), each call with the robot's NodeSettings in
force:

  key       the observation's name for the value (Observation.inputs). 'state' is the
            robot state the engine reads (Frame.state, for a model that reads one); a value
            under any other key reaches no model: such an input only gates (its problem).
            Keys are unique per robot.
  read_at(time_s, settings) -> (value, problem)
            At each complete set of images (executor thread): the value at the observation's
            time `time_s` (node clock seconds), problem None; or value None and
            problem = (reason, is_bad_input). A problem stops the frame before the engine:
            is_bad_input True refuses it (bad input: the robot holds, the error is counted,
            the results of its older frames are dropped); False holds for it as stale input
            (a value not received yet or too far from the image). The reason starts with a
            command_rules REASON_ prefix (REASON_BAD_INPUT, REASON_STALE), which the logs and
            /diagnostics group by.
  add_to_status(status)    extra /diagnostics values (diagnostic_msgs KeyValue)
  forget()                 the node clock went back (clock_jumps.py): drop what was kept on
                           the old time line
  destroy()                remove this adapter's ROS entities

Threads: subscription callbacks and read_at run on the executor; an adapter that is read from
another thread (the state's measured joint positions, for the joint-position hold) guards what
it keeps with a lock.
"""
from __future__ import annotations

from typing import Any


class InputAdapter:
    """Base class (see the module docstring for the contract): no value, no problem."""

    key: str = ''

    def read_at(self, time_s: float, settings) -> tuple[Any, tuple[str, bool] | None]:
        return None, None

    def add_to_status(self, status) -> None:
        pass

    def forget(self) -> None:
        pass

    def destroy(self) -> None:
        pass


__all__ = ['InputAdapter']
