"""Images of the scripted expert closing a Meta-World drawer (seed 7, 64 px): the frames the
embedded models' tests decode. Skips the calling test where the simulator cannot render."""
import pytest


def drawer_close_frames(num_frames: int) -> list:
    """The first ``num_frames`` camera images of one expert episode of drawer-close."""
    from vla_spec_ros.sim.metaworld_env import make_env, sim_unavailable_reason
    reason = sim_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    frames = []
    with make_env('drawer-close', seed=7, image_size=64) as env:
        image = env.reset(7)
        for _ in range(num_frames):
            frames.append(image)
            image, _, _, _ = env.step(env.expert_action())
    return frames
