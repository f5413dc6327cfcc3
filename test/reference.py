"""The plain AR reference (S1) for tests: one prefill, then single-token decodes, each request
in a private cache through the dense-mask attention path (engine/ar.py) — independent of the
engine's ring, scheduler, segment attention, static buffers and graphs."""
from vla_spec_ros.engine.ar import decode_ar
from vla_spec_ros.engine.result import Frame


def ar_reference_tokens(policy, frames) -> list[tuple[int, ...]]:
    """Greedy AR tokens of every frame (``Frame`` objects) with ``policy``'s runner/config."""
    runner, config = policy.engine.runner, policy.config
    out = []
    for frame in frames:
        prompt = runner.prepare_prompt(Frame(frame.image, frame.instruction), config)
        tokens, _ = decode_ar(runner, prompt.embeds, runner.action_dim,
                              config.restrict_to_action_tokens)
        out.append(tuple(tokens))
    return out
