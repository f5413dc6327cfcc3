"""What the checkpoint reads and decides, as far as the node cares (`ModelIO`: image slots,
state, action size, reasoning text; the control steps a frame decides), and the start-up
refusal of a robot whose inputs or action space do not fit it. Pure Python: the harness and
the benchmarks read it without rclpy.
"""
from __future__ import annotations

from dataclasses import dataclass

from vla_spec_ros.ros.command_rules import check_action_dim


@dataclass(frozen=True)
class ModelIO:
    """What the checkpoint reads and decides, as far as the node cares."""

    num_image_slots: int      # images a frame may carry (1 .. this)
    uses_state: bool          # whether its prompt reads Frame.state
    action_dim: int           # values per action step
    writes_reasoning: bool = False    # text before the action (ECoT): ~/reasoning


def model_io_of(policy) -> ModelIO:
    """The checkpoint's ModelIO from the engine's runner (its model and codec); a policy
    that does not say (a wrapper in tests) is read as one image, no state, 7 values."""
    runner = getattr(policy.engine, 'runner', None)
    model, codec = getattr(runner, 'model', None), getattr(runner, 'codec', None)
    shape = tuple(getattr(codec, 'action_shape', ()) or (7,))
    return ModelIO(int(getattr(model, 'num_image_slots', 1)),
                   bool(getattr(model, 'uses_state', False)), int(shape[-1]),
                   bool(getattr(codec, 'writes_reasoning', False)))


def check_model_io(model_io: ModelIO, settings, logger) -> None:
    """Refuse, before anything is subscribed, a robot whose inputs or action space do not fit
    the checkpoint (ValueError naming the parameter); warn about a state nobody reads."""
    if settings.num_image_slots > model_io.num_image_slots:
        raise ValueError(f'image_slots: {list(settings.image_slots)} but the model reads at '
                         f'most {model_io.num_image_slots} image(s) per frame')
    check_action_dim(model_io.action_dim, settings)
    if settings.state_input != 'none' and not model_io.uses_state:
        logger.warning(f'state_input {settings.state_input}: this model reads no state; the '
                       'state only gates staleness (max_state_age)')
    elif settings.state_input == 'none' and model_io.uses_state:
        logger.warning('this model reads a robot state and state_input is none: its family '
                       'fills in its default state')


def chunk_steps_of(policy) -> int:
    """The control steps one frame decides (the checkpoint's action_chunk; 1 when the policy
    does not say, e.g. a wrapper in tests)."""
    return int(getattr(getattr(policy, 'model_config', None), 'action_chunk', 1) or 1)
