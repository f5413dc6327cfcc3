"""Meta-World tasks behind the interface a VLA sees: an RGB image in, a 7-dim action out.

Wraps the `metaworld` package (v3 environments, Sawyer arm, MuJoCo physics) for the embedded
default model: one `MetaWorldTask` per task, seeded resets, an off-screen RGB camera rendered on
CPU (`MUJOCO_GL=osmesa`), the task's built-in scripted expert, and the mapping between
Meta-World's 4-dim action and OpenVLA's 7-dim end-effector action (docs/openvla.md, Action
tokens and un-normalisation).

Action conventions (both directions are exact inverses on Meta-World's action box [-1, 1]^4):

    Meta-World a4 = (ax, ay, az, effort):  ax..az in [-1, 1] move the mocap target by
        a * POSITION_SCALE_M metres per step; effort in [-1, 1], -1 = open, +1 = close.
    VLA a7 = (dx, dy, dz, droll, dpitch, dyaw, gripper):  dx..dz in metres per step,
        rotation deltas in radians (always 0 here: the Sawyer's orientation is fixed),
        gripper absolute as in OpenVLA, 1 = open, 0 = closed.

    a4 -> a7:  d = clip(a, -1, 1) * POSITION_SCALE_M;  gripper = (1 - clip(effort, -1, 1)) / 2
    a7 -> a4:  a = clip(d / POSITION_SCALE_M, -1, 1);  effort = clip(1 - 2 * gripper, -1, 1);
               the rotation deltas are ignored (logged in `info` by `MetaWorldTask.step`).

A node that publishes a7 as a twist (linear = d, angular = rotation deltas) and the gripper value
maps back to the same Meta-World action through `to_metaworld_action`.

Rendering: shadows, reflections and multisampling are off (about 8-12 ms per image with OSMesa
instead of 50-100 ms); demonstrations and evaluation go through this same renderer, so the model
sees one image distribution. Meta-World's `corner*` cameras are mounted upside down; images whose
camera "up" axis points below the horizon are rotated 180 degrees (a rotation, not a mirror).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

# Meta-World's `action_scale`: one unit of its xyz action moves the mocap target by 1 cm.
POSITION_SCALE_M = 0.01
ACTION_DIM = 7
METAWORLD_ACTION_DIM = 4
GRIPPER_OPEN = 1.0
GRIPPER_CLOSED = 0.0
# Meta-World's `corner4` view: objects larger and less hidden by the arm than in `corner`,
# which matters at the small input sizes of the embedded model.
DEFAULT_CAMERA = "corner4"
DEFAULT_IMAGE_SIZE = 128
DEFAULT_MAX_STEPS = 150
CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")


@dataclass(frozen=True)
class TaskSpec:
    """One Meta-World task with the phrasings an operator might use for it."""

    name: str                       # short name used by the CLI, e.g. "drawer-open"
    env_name: str                   # Meta-World v3 environment name, e.g. "drawer-open-v3"
    instructions: tuple[str, ...]   # natural phrasings; one is drawn per episode


# Tasks whose scripted expert succeeded on at least 90 % of seeded episodes within 150 steps
# in metaworld 3.1.1 (measured with `evaluate_scripted`).
TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("button-press-topdown", "button-press-topdown-v3", (
        "press the button down from the top",
        "push the button on the yellow box down",
        "press the button from above",
        "press down on the red button",
    )),
    TaskSpec("drawer-open", "drawer-open-v3", (
        "open the drawer",
        "pull the green drawer open",
        "slide the drawer out",
        "pull out the drawer",
    )),
    TaskSpec("drawer-close", "drawer-close-v3", (
        "close the drawer",
        "push the green drawer shut",
        "slide the drawer closed",
        "push the drawer in",
    )),
    TaskSpec("door-open", "door-open-v3", (
        "open the door",
        "swing the black door open",
        "pull the door open by its handle",
    )),
    TaskSpec("window-open", "window-open-v3", (
        "open the window",
        "slide the window open",
        "push the sliding window open",
    )),
    TaskSpec("window-close", "window-close-v3", (
        "close the window",
        "slide the window shut",
        "push the sliding window closed",
    )),
    TaskSpec("reach", "reach-v3", (
        "reach the red target",
        "move the gripper to the target",
        "touch the red point with the gripper",
    )),
    TaskSpec("push", "push-v3", (
        "push the puck to the goal",
        "slide the red puck onto the green target",
        "push the puck to the green dot",
    )),
    TaskSpec("faucet-open", "faucet-open-v3", (
        "turn on the faucet",
        "open the faucet",
        "rotate the faucet handle open",
    )),
    TaskSpec("handle-press", "handle-press-v3", (
        "press the handle down",
        "push the handle down",
        "press down on the handle",
    )),
    TaskSpec("coffee-button", "coffee-button-v3", (
        "press the coffee machine button",
        "push the button on the coffee machine",
        "start the coffee machine",
    )),
)
TASK_BY_NAME: dict[str, TaskSpec] = {task.name: task for task in TASKS}
# The proposed training set of the default model: large objects, one randomized position each,
# expert success 100 %. (door-open's expert stalls in about 1 of 10 episodes; reach and push
# targets are 1-2 pixels wide at 64 x 64.)
DEFAULT_TASK_NAMES: tuple[str, ...] = (
    "button-press-topdown", "drawer-open", "drawer-close", "window-open", "window-close",
    "handle-press",
)


def get_task(task_name: str) -> TaskSpec:
    """The `TaskSpec` for a short name or a Meta-World env name ("drawer-open[-v3]")."""
    name = task_name[:-3] if task_name.endswith("-v3") else task_name
    if name not in TASK_BY_NAME:
        raise ValueError(f"task_name: unknown task {task_name!r}; known: {sorted(TASK_BY_NAME)}")
    return TASK_BY_NAME[name]


# ---------------------------------------------------------------------------------------------
# Action mapping (pure numpy; tested without Meta-World)
# ---------------------------------------------------------------------------------------------

def to_vla_action(action4) -> np.ndarray:
    """Meta-World action (4,) -> VLA end-effector action (7,) float32, conventions above."""
    a = np.asarray(action4, dtype=np.float64)
    if a.shape != (METAWORLD_ACTION_DIM,):
        raise ValueError(f"action4: expected shape (4,), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"action4: non-finite values {a}")
    a = np.clip(a, -1.0, 1.0)       # what Meta-World applies; experts may exceed the box
    out = np.zeros(ACTION_DIM, dtype=np.float64)
    out[:3] = a[:3] * POSITION_SCALE_M
    out[6] = (1.0 - a[3]) / 2.0     # effort -1 (open) -> 1, effort +1 (close) -> 0
    return out.astype(np.float32)


def to_metaworld_action(action7) -> np.ndarray:
    """VLA end-effector action (7,) -> Meta-World action (4,) float32 in [-1, 1].

    The rotation deltas (indices 3..5) are ignored: the Sawyer's orientation is fixed.
    """
    a = np.asarray(action7, dtype=np.float64)
    if a.shape != (ACTION_DIM,):
        raise ValueError(f"action7: expected shape (7,), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"action7: non-finite values {a}")
    out = np.empty(METAWORLD_ACTION_DIM, dtype=np.float64)
    out[:3] = np.clip(a[:3] / POSITION_SCALE_M, -1.0, 1.0)
    out[3] = np.clip(1.0 - 2.0 * a[6], -1.0, 1.0)
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------

def _import_backend():
    """Import mujoco and metaworld with a CPU off-screen GL backend unless one is chosen.

    Triton (the engine's kernels) is imported first when installed: once OSMesa has loaded
    Mesa's llvmpipe (the system libLLVM), importing Triton's bundled LLVM segfaults the process
    (observed with Debian's libosmesa6 and triton 3.x); in the other order both work.
    """
    try:
        import triton  # noqa: F401  (load order only; see above)
    except ImportError:
        pass
    os.environ.setdefault("MUJOCO_GL", "osmesa")
    import metaworld
    import metaworld.policies
    import mujoco
    return mujoco, metaworld


def sim_unavailable_reason() -> str | None:
    """None when Meta-World can be built and rendered off-screen here, else why not."""
    try:
        mujoco, _ = _import_backend()
    except Exception as exc:  # ImportError, or a GL library failing at import
        return f"metaworld/mujoco not importable: {exc}"
    try:
        model = mujoco.MjModel.from_xml_string(
            "<mujoco><worldbody><geom size='1'/></worldbody></mujoco>")
        renderer = mujoco.Renderer(model, 8, 8)
        renderer.update_scene(mujoco.MjData(model))
        renderer.render()
        renderer.close()
    except Exception as exc:
        return (f"off-screen rendering failed with MUJOCO_GL={os.environ.get('MUJOCO_GL')}"
                f" (install libosmesa6): {exc}")
    return None


class MetaWorldTask:
    """One seeded Meta-World task rendering RGB images and taking 7-dim VLA actions.

    `reset(seed)` -> image (H, W, 3) uint8; `step(action7)` -> (image, is_success, is_done,
    info). An episode is done at the first success or after `max_steps` steps. Use one
    instance from one thread at a time (the GL context is made current per render).
    """

    def __init__(self, task_name: str, seed: int = 0, image_size: int = DEFAULT_IMAGE_SIZE,
                 camera: str = DEFAULT_CAMERA, max_steps: int = DEFAULT_MAX_STEPS):
        self.task = get_task(task_name)
        if not isinstance(image_size, (int, np.integer)) or not 8 <= image_size <= 480:
            raise ValueError(f"image_size: expected an int in [8, 480], got {image_size!r}")
        if camera not in CAMERAS:
            raise ValueError(f"camera: expected one of {CAMERAS}, got {camera!r}")
        if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
            raise ValueError(f"max_steps: expected a positive int, got {max_steps!r}")
        mujoco, metaworld = _import_backend()
        env_cls = metaworld.env_dict.ALL_V3_ENVIRONMENTS[self.task.env_name]
        if max_steps > env_cls.max_path_length:  # metaworld refuses steps past this limit
            raise ValueError(f"max_steps: at most {env_cls.max_path_length}, got {max_steps}")
        self.image_size = int(image_size)
        self.camera = camera
        self.max_steps = int(max_steps)
        env = env_cls()
        if env.action_scale != POSITION_SCALE_M:
            env.close()
            raise RuntimeError(f"metaworld action_scale {env.action_scale} differs from "
                               f"POSITION_SCALE_M {POSITION_SCALE_M}: unsupported version")
        # Goal observable (the experts read the goal from the state) and a fresh object/goal
        # position from the env's own seeded generator at every reset, as metaworld's
        # `*-goal-observable` classes do, without freezing one configuration.
        env._partially_observable = False
        del env.sawyer_observation_space      # cached property: recomputed for the new layout
        env._set_task_called = True
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        self._env = env
        self._expert = metaworld.policies.ENV_POLICY_MAP[self.task.env_name]()
        env.model.vis.quality.offsamples = 0  # no multisampling (must precede the GL context)
        self._renderer = mujoco.Renderer(env.model, self.image_size, self.image_size)
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._camera_id = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        # Camera y axis (image up) in world coordinates: column 1 of its rotation matrix
        # (metaworld ran mj_forward at construction, so cam_xmat is current).
        cam_up = env.data.cam_xmat[self._camera_id].reshape(3, 3)[:, 1]
        self._is_upside_down = bool(cam_up[2] < 0.0)
        self._state: np.ndarray | None = None  # (39,) Meta-World state vector of the last step
        self.num_steps = 0
        self.is_success = False
        self.seed = int(seed)
        env.seed(self.seed)  # the first reset() without a seed is the same as reset(seed)

    @property
    def instructions(self) -> tuple[str, ...]:
        return self.task.instructions

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start an episode; with `seed` the object/goal placement is a function of it."""
        if seed is not None:
            self._env.seed(int(seed))
        state, _ = self._env.reset()
        self._state = state
        self.num_steps = 0
        self.is_success = False
        return self.render()

    def render(self) -> np.ndarray:
        """The current camera image, (H, W, 3) uint8 RGB, upright."""
        self._renderer.update_scene(self._env.data, camera=self._camera_id)
        image = self._renderer.render()
        if self._is_upside_down:
            image = image[::-1, ::-1]
        return np.ascontiguousarray(image)

    def step(self, action7) -> tuple[np.ndarray, bool, bool, dict]:
        """Apply a VLA action (7,); returns (image (H, W, 3) uint8, is_success, is_done, info)."""
        if self._state is None or self.num_steps >= self.max_steps or self.is_success:
            raise ValueError("step: the episode is over; call reset() first")
        action7 = np.asarray(action7, dtype=np.float64)
        action4 = to_metaworld_action(action7)
        state, reward, _, _, mw_info = self._env.step(action4)
        self._state = state
        self.num_steps += 1
        self.is_success = bool(mw_info["success"])
        is_done = self.is_success or self.num_steps >= self.max_steps
        info = {
            "num_steps": self.num_steps,
            "reward": float(reward),
            "metaworld_action": action4,
            "ignored_rotation": action7[3:6].copy(),
        }
        return self.render(), self.is_success, is_done, info

    @property
    def state(self) -> np.ndarray:
        """Meta-World's state vector (39,) of the current step (hand position 0:3, gripper
        opening 3, the task object's position 4:7, ..., the goal 36:39), a copy."""
        if self._state is None:
            raise ValueError("state: call reset() first")
        return np.array(self._state, dtype=np.float64)

    def camera_matrix(self) -> np.ndarray:
        """The camera's 3 x 4 projection of world points to pixels of ``render``'s image
        (sim/camera_projection.py); the camera is fixed, so one matrix serves an episode."""
        from .camera_projection import camera_matrix
        model, data = self._env.model, self._env.data
        return camera_matrix(data.cam_xpos[self._camera_id], data.cam_xmat[self._camera_id],
                             float(model.cam_fovy[self._camera_id]), self.image_size,
                             self._is_upside_down)

    def expert_action(self) -> np.ndarray:
        """The built-in scripted expert's action for the current state, as a VLA action (7,)."""
        if self._state is None:
            raise ValueError("expert_action: call reset() first")
        with warnings.catch_warnings():
            # The experts warn when their proportional gains exceed the [-1, 1] box; the
            # environment clips, and so does `to_vla_action`.
            warnings.simplefilter("ignore")
            action4 = self._expert.get_action(self._state)
        return to_vla_action(action4)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._env.close()

    def __enter__(self) -> MetaWorldTask:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_env(task_name: str, seed: int = 0, image_size: int = DEFAULT_IMAGE_SIZE,
             camera: str = DEFAULT_CAMERA, max_steps: int = DEFAULT_MAX_STEPS) -> MetaWorldTask:
    """Build a `MetaWorldTask`; the first reset uses `seed`."""
    return MetaWorldTask(task_name, seed=seed, image_size=image_size, camera=camera,
                         max_steps=max_steps)
