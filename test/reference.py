"""The plain AR reference (S1) for tests: ``engine.ar.reference_tokens`` with a policy's own
runner and configuration."""
from vla_spec_ros.engine.ar import reference_tokens


def ar_reference_tokens(policy, frames) -> list[tuple[int, ...]]:
    """Greedy AR tokens of every frame (``Frame`` objects) with ``policy``'s runner/config."""
    return reference_tokens(policy.engine.runner, frames, policy.config)
