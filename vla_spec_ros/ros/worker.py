"""The node's inference thread: frames of every robot in, one engine stepped, actions out.

  loop: take the newest frame of each robot (robots visited in rotating order)
        -> convert -> Engine.submit (after dropping that robot's frames not yet started)
        -> Engine.step while the engine has work -> RobotChannel.handle_finished

Inference never runs in a ROS callback. Engine calls are serialised by `engine_lock` (held for
one submit or one step; reset and tunable changes take it between steps). The idle worker
blocks on a wakeup event that every robot's frame slot sets; while requests are in flight it
never blocks, so they keep stepping (S6) and new frames join them between steps.

Fairness: each robot has at most one frame waiting in the engine (latest wins, older ones are
dropped and counted), and the engine admits waiting frames first-in first-out across streams,
so a robot with a fast camera cannot starve a slow one.

Order: a frame refused as bad input gets its robot's hold (zero motion), and no command for an
older image of that robot follows it: its waiting frame is dropped, and the results of its
frames in flight are not published (RobotChannel.refuse).

Stopping: each turn of the loop (take frames, submit, step, publish) runs under `_turn`, so
`paused()` waits for the turn in progress and keeps the next one from starting (deactivation,
`~/reset` and a new instruction send their holds inside it: no action of the worker can follow
them), and `stop()` returns only once the thread has ended (or says it has not). The idle wait
for a frame is outside the turn, and a requested pause goes before the next turn, so a pause
costs at most the turn in progress (a parameter set from the executor does not wait out an
idle wait, nor a busy worker's next turns).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

from vla_spec_ros import image_messages
from vla_spec_ros.engine.result import Frame, describe_error
from vla_spec_ros.ros import command_rules as cmd

WORKER_IDLE_WAIT_S = 0.05     # how long the idle worker blocks waiting for a frame


class InferenceWorker:
    """Runs the loop above on its own thread until `stop()`.

    `take_tunables()` returns the engine tunable changes queued since the last call (applied
    before the next submit, so a request keeps the values it was submitted with).
    `on_submitted(channel, frame)` (optional) sees every frame that entered the engine (the
    recorder uses it).
    """

    def __init__(self, engine, channels, engine_lock: threading.Lock, wakeup: threading.Event,
                 take_tunables, on_submitted=None):
        self.engine = engine
        self.channels = {channel.stream_id: channel for channel in channels}
        self._order = list(channels)
        self.engine_lock = engine_lock
        self._wakeup = wakeup
        self._take_tunables = take_tunables
        self._on_submitted = on_submitted
        self._stop = threading.Event()
        # Held for one turn of the loop, and by `paused()`; reentrant, so a pause nests.
        self._turn = threading.RLock()
        # Cleared while a pause is requested: the loop waits here before its next turn.
        self._resume = threading.Event()
        self._resume.set()
        self._pauses = 0
        self._pauses_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name='vla_spec_worker', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """End the thread after its turn in progress; whether it has ended within `timeout`
        (a turn stuck in the engine may still publish after a False)."""
        self._stop.set()
        self._wakeup.set()
        self._resume.set()           # the loop ends at its next check, paused or not
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    @contextlib.contextmanager
    def paused(self):
        """No turn of the loop runs inside: waits for the one in progress (one submit and
        one engine step) and holds the next one back until the block ends. Nests and may be
        entered from several threads."""
        with self._pauses_lock:
            self._pauses += 1
            self._resume.clear()
        try:
            with self._turn:
                yield
        finally:
            with self._pauses_lock:
                self._pauses -= 1
                if self._pauses == 0:
                    self._resume.set()

    def _has_work(self) -> bool:
        with self.engine_lock:
            return self.engine.has_work()

    def _loop(self) -> None:
        turn = 0
        while not self._stop.is_set():
            self._wait_for_work()
            self._resume.wait()             # a requested pause goes first
            with self._turn:
                turn = self._turn_once(turn)

    def _wait_for_work(self) -> None:
        """Idle: wait for a frame (at most WORKER_IDLE_WAIT_S), outside the turn so a pause
        does not wait it out. An engine whose has_work fails is the turn's to report (it
        asks again, inside its handler)."""
        try:
            is_idle = not self._has_work()
        except Exception:
            return
        if is_idle:
            self._wakeup.wait(WORKER_IDLE_WAIT_S)

    def _turn_once(self, turn: int) -> int:
        """One turn: each robot's newest frame submitted, one engine step, its results
        published; an engine failure holds every robot and resets the engine."""
        try:
            if self._stop.is_set():
                return turn
            self._wakeup.clear()
            # Visit robots in rotating order so none is always submitted last.
            turn = (turn + 1) % len(self._order)
            for channel in self._order[turn:] + self._order[:turn]:
                observation = channel.slot.take(0.0)
                if observation is not None:
                    self._submit(channel, observation)
            if self._has_work():
                self._step()
        except Exception as exc:   # the engine broke its contract; hold and start over
            self._fail_all(f'{cmd.REASON_ENGINE_ERROR}: {describe_error(exc)}')
            try:
                with self.engine_lock:
                    self.engine.reset()
            except Exception as reset_exc:
                self._fail_all(f'{cmd.REASON_ENGINE_ERROR}: reset failed: '
                               f'{describe_error(reset_exc)}')
                self._stop.wait(1.0)
        return turn

    def _fail_all(self, reason: str) -> None:
        for channel in self._order:
            channel.reject(reason)

    def _submit(self, channel, observation) -> None:
        """One robot's newest observation (frame_slot.Observation) into the engine: checked
        (enabled, instruction, fresh, its pairing / state error), converted slot by slot
        (bad input names the slot), submitted as one Frame with the state when the model
        reads one."""
        taken = time.monotonic()
        info = observation.info
        settings = channel.settings
        if not (settings.enabled and channel.is_active):
            return
        if not cmd.has_instruction(settings.instruction):
            channel.hold_state(cmd.REASON_NO_INSTRUCTION)
            return
        stale = cmd.freshness_reason(channel.age_of(info), settings,
                                     max_age_s=channel.age_limit(settings))
        if stale is not None:          # already too old: do not spend compute on it
            channel.reject(stale, is_stale=True)
            return
        if observation.error is not None:
            if observation.is_bad_input:
                self._refuse(channel, info, observation.error)
            else:
                channel.reject(observation.error, is_stale=True)
            return
        images = []
        for name, msg in zip(channel.observation.slot_names, observation.messages):
            try:            # converted and size-checked here, so a refusal names its slot
                images.append(image_messages.model_rgb(msg))
            except Exception as exc:    # any failure is this camera's bad input: refused for
                # its robot alone, never an engine error that holds and resets every robot
                where = f'image slot {name}' if name else 'image'
                detail = str(exc) if isinstance(exc, ValueError) else describe_error(exc)
                self._refuse(channel, info, f'{cmd.REASON_BAD_INPUT}: {where} {detail}')
                return
        info = dataclasses.replace(info, taken_mono=taken, converted_mono=time.monotonic())
        frame = Frame(images[0] if len(images) == 1 else tuple(images), settings.instruction,
                      settings.unnorm_key_or_none, channel.stream_id, user_data=info,
                      control_step=channel.control_step(info, settings),
                      state=observation.state if channel.model_reads_state else None)
        with self.engine_lock:
            pending = self._take_tunables()
            if pending:          # validated by settings_from_parameters when they were set
                self.engine.set_tunables(**pending)
            try:
                _, dropped = self.engine.replace_waiting(frame)
            except ValueError as exc:           # the engine refused it (size, instruction...)
                refused = f'{cmd.REASON_BAD_INPUT}: {exc}'
            else:
                refused = None
        if refused is not None:
            self._refuse(channel, info, refused)
            return
        channel.stats.record_dropped(len(dropped))
        channel.stats.record_submitted()
        if self._on_submitted is not None:
            self._on_submitted(channel, frame)

    def _refuse(self, channel, info, reason: str) -> None:
        """A frame of ``channel`` that will not be answered (bad input): nothing older than it
        is acted on after its hold. The robot's frame still waiting in the engine is
        dropped (counted), and results of its frames in flight are dropped when they finish
        (``RobotChannel.refuse``)."""
        with self.engine_lock:
            dropped = self.engine.drop_waiting(channel.stream_id)
        channel.stats.record_dropped(len(dropped))
        channel.refuse(info, reason)

    def _step(self) -> None:
        with self.engine_lock:
            finished = self.engine.step()
        for item in finished:
            channel = self.channels.get(item.frame.stream_id)
            if channel is not None:       # a robot's channel outlives its requests
                self._handle(channel, item)

    @staticmethod
    def _handle(channel, item) -> None:
        """One robot's finished frame; a failure deciding or publishing it holds that robot
        alone (the engine kept its contract: the other robots' results of this step still go
        out, and nothing is reset)."""
        try:
            channel.handle_finished(item)
        except Exception as exc:
            channel.reject_result(f'{cmd.REASON_ENGINE_ERROR}: publishing its action failed: '
                                  f'{describe_error(exc)}')


__all__ = ['InferenceWorker', 'WORKER_IDLE_WAIT_S']
