"""The checks a run-time parameter change of one robot must pass beyond each value's range
(node_settings.py) and the load-time rule (params.change_refusal), against what the node
started with and what the checkpoint reads: pure functions raising ValueError naming the
parameter (serving.py's `validate` calls them; the start-up checks call the first).
"""
from __future__ import annotations

from vla_spec_ros.ros.command_rules import check_action_dim


def check_unnorm_key(key: str, unnorm_keys: tuple) -> None:
    """A key the checkpoint has; empty only when it has one dataset (with several, an
    empty key started "ready" and then refused every frame)."""
    if key and key not in unnorm_keys:
        raise ValueError(f'unnorm_key: {key!r} not in this checkpoint\'s '
                         f'{list(unnorm_keys)}')
    if not key and len(unnorm_keys) > 1:
        raise ValueError(f'unnorm_key: empty, but this checkpoint has '
                         f'{len(unnorm_keys)} datasets {list(unnorm_keys)}: set '
                         'the one the robot\'s actions are in')


def check_joint_count(proposed, current, action_dim: int) -> None:
    """joint_names may be renamed at run time, not resized: with a checkpoint of n
    values, n - 1 joints make the last value the gripper and n joints make it a joint,
    so a changed count would send the gripper's value to a joint (or the reverse).
    The count must fit the checkpoint either way."""
    if len(proposed.joint_names) != len(current.joint_names):
        raise ValueError(f'joint_names: {len(proposed.joint_names)} joints, but the node '
                         f'started with {len(current.joint_names)}: the number of joints '
                         'decides whether the checkpoint\'s last value is the gripper, so it '
                         'is fixed at start-up (rename joints at run time, restart to change '
                         'their number)')
    check_action_dim(action_dim, proposed)


def check_pose_frame(proposed, current) -> None:
    """With pose targets, the tool pose is read in frame_id from start-up on (its TF
    lookup, its topic's frame): a frame_id changed at run time would stamp targets
    computed in the old frame with the new one."""
    if current.pose_targets and proposed.frame_id != current.frame_id:
        raise ValueError(f'frame_id: fixed at start-up while pose_targets is on (the tool '
                         f'pose is read in {current.frame_id!r}); restart the node to '
                         'change it')


def check_state_size(proposed, current, uses_state: bool, check_frame) -> None:
    """The state a changed state_joint_names (or state input) gives, checked by the
    engine as it checks every frame's (the model's state size; ``check_frame(settings)``
    raises ValueError as the engine would): before, a size the model cannot read was
    refused at start-up (the warm-up frame) but accepted at run time, and then every frame
    was refused."""
    if not uses_state or proposed.state_order == current.state_order:
        return
    try:
        check_frame(proposed)
    except ValueError as exc:
        raise ValueError(f'state_joint_names: {len(proposed.state_order)} joints give a '
                         f'state this model cannot read ({exc})') from None
