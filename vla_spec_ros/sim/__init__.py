"""Meta-World simulation for the embedded default model (README, "The embedded model").

`metaworld_env` wraps one task behind the VLA interface (RGB image in, 7-dim action out);
`demos` collects scripted demonstrations and evaluates policies with one episode loop.
Importing this package does not import mujoco or metaworld; building an environment does.
"""

from vla_spec_ros.sim.demos import (
    DATASET_NAME, DemoSet, EpisodeResult, action_norm_stats, collect_demos, evaluate_policy,
    evaluate_scripted, load_demos, run_episode)
from vla_spec_ros.sim.metaworld_env import (
    DEFAULT_TASK_NAMES, TASKS, MetaWorldTask, TaskSpec, get_task, make_env,
    sim_unavailable_reason, to_metaworld_action, to_vla_action)

__all__ = [
    "DATASET_NAME", "DEFAULT_TASK_NAMES", "DemoSet", "EpisodeResult", "MetaWorldTask", "TASKS",
    "TaskSpec", "action_norm_stats", "collect_demos", "evaluate_policy", "evaluate_scripted",
    "get_task", "load_demos", "make_env", "run_episode", "sim_unavailable_reason",
    "to_metaworld_action", "to_vla_action",
]
