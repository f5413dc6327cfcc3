"""Policies whose engine is wrapped, for node tests: the real engine does the work, a wrapper
watches or alters what goes in and comes out. The node reads a policy's ``engine``,
``unnorm_keys`` and ``model_config`` only."""
import dataclasses

import numpy as np


class DelegatingEngine:
    """Everything goes to the real engine unless a subclass overrides it."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)


class FaultEngine(DelegatingEngine):
    """While ``fault`` is set, step() fails: 'raise' (an exception), 'error' (every frame
    finished with an error), 'nan' (a valid-looking action with a NaN), 'invalid' (an action
    the codec refused: is_valid False, reason 'injected non-action token')."""

    def __init__(self, engine):
        super().__init__(engine)
        self.fault = None

    def step(self):
        finished = self._engine.step()
        if self.fault == 'raise':
            raise RuntimeError('injected failure')
        if self.fault == 'error':
            return [dataclasses.replace(f, result=None, error='injected error') for f in finished]
        if self.fault in ('nan', 'invalid'):
            out = []
            for f in finished:
                action = np.array(f.result.action, copy=True)
                action[1] = np.nan
                result = dataclasses.replace(
                    f.result, action=action, is_valid=self.fault == 'nan',
                    invalid_reason=None if self.fault == 'nan' else 'injected non-action token')
                out.append(dataclasses.replace(f, result=result))
            return out
        return finished


class RecordingEngine(DelegatingEngine):
    """Keeps the frames submitted to the engine (``frames``)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.frames = []

    def submit(self, frame):
        self.frames.append(frame)
        return self._engine.submit(frame)

    def replace_waiting(self, frame):          # how the node submits a camera frame
        self.frames.append(frame)
        return self._engine.replace_waiting(frame)


class WrappedPolicy:
    """`policy` with its engine wrapped by `wrapper` (e.g. FaultEngine)."""

    def __init__(self, policy, wrapper):
        self.engine = wrapper(policy.engine)
        self.unnorm_keys = policy.unnorm_keys
        self.model_config = getattr(policy, 'model_config', None)
