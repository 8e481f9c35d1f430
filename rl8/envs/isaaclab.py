"""Isaac Lab 3.0's tasks as rl8 envs, ``PPO("isaaclab:<task id>")`` (``docs/simulators.md``).

Isaac Lab is an optional dependency (Python 3.12, its own virtualenv), imported only when a task
is built. Kit-less, Isaac Lab simulates with Newton (the MuJoCo-Warp solver, ``presets=
"newton_mjwarp"``) on the CPU or a GPU; with Isaac Sim installed, its app (Kit) is started where
the task's config needs it. Either way it is started by Isaac Lab's ``launch_simulation``, once
per process, and stopped when the env is closed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from pathlib import Path
from typing import Any

import gymnasium
import torch

from rl8.envs.rsl_rl import RslRlEnv
from rl8.verbosity import is_verbose

__all__ = [
    "IsaacLabEnv",
    "isaaclab_device",
    "isaaclab_runner_cfg",
    "local_assets",
    "make_isaaclab_env",
]

#: The assets :func:`local_assets` cuts out of the test stages the ``isaaclab`` wheel ships:
#: the file under the asset root -> (the stage under ``isaaclab/source``, the prim holding the asset).
_LOCAL_ASSETS = {
    "Isaac/IsaacLab/Robots/Classic/Cartpole/cartpole.usd": (
        "isaaclab_tasks/test/golden_stages/cartpole/newton-isaacsim_rtx_renderer-rgb.usda",
        "/World/envs/env_0/Robot",
    ),
}


def isaaclab_device(device: torch.device | str) -> str:
    """The device string Isaac Lab's configs take for the torch device ``device``: ``"cpu"`` or
    ``"cuda:<index>"`` (``"cuda"`` is ``"cuda:0"``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    if device.type != "cpu":
        raise ValueError(f"Isaac Lab simulates on 'cpu' or 'cuda:<index>', got device {str(device)!r}")
    return "cpu"


def local_assets(root: str | os.PathLike[str]) -> Path:
    """Write the assets that can be cut out of the ``isaaclab`` wheel's own files into the asset
    root ``root`` (for a machine that cannot reach NVIDIA's asset server), and return ``root``.

    Every Isaac Lab task loads its USD assets from NVIDIA's cloud. The wheel ships flattened test
    stages that hold whole scenes; the cartpole of ``Isaac-Cartpole-Direct`` and
    ``Isaac-Cartpole`` is copied from one of them (its meshes and joints; the joints' targets
    moved with it) to ``<root>/Isaac/IsaacLab/Robots/Classic/Cartpole/cartpole.usd``, where
    Isaac Lab looks when ``ISAACSIM_ASSET_ROOT=<root>``. The ground plane is not in the stages:
    build such a task with ``ground=False`` (:func:`make_isaaclab_env`). Files already there are
    left as they are.

    Args:
        root: The asset root folder (made if missing).

    Raises:
        ImportError: ``isaaclab`` (and its ``pxr``) is not installed.
        FileNotFoundError: The wheel has no such test stage (another Isaac Lab release).
    """
    import isaaclab  # optional heavy dependency: the wheel whose test stages hold the assets
    from pxr import Sdf

    root = Path(root)
    source_root = Path(isaaclab.__file__).parent / "source"
    for target, (stage_file, prim) in _LOCAL_ASSETS.items():
        out_file = root / target
        if out_file.is_file():
            continue
        stage = Sdf.Layer.FindOrOpen(str(source_root / stage_file))
        if stage is None:
            raise FileNotFoundError(
                f"local_assets: the isaaclab wheel ({importlib.metadata.version('isaaclab')}) has no "
                f"test stage {source_root / stage_file}"
            )
        out_file.parent.mkdir(parents=True, exist_ok=True)
        layer = Sdf.Layer.CreateNew(str(out_file))
        for key in ("metersPerUnit", "kilogramsPerUnit", "upAxis"):
            layer.pseudoRoot.SetInfo(key, stage.pseudoRoot.GetInfo(key))
        # the flattened stage's meshes are root prims that the asset's parts reference
        for spec in stage.rootPrims:
            if spec.name.startswith("Flattened_Prototype"):
                Sdf.CopySpec(stage, spec.path, layer, spec.path)
        name = Path(target).stem
        Sdf.CreatePrimInLayer(layer, f"/{name}")
        Sdf.CopySpec(stage, prim, layer, f"/{name}")
        layer.defaultPrim = name
        layer.Save()
    return root


def isaaclab_runner_cfg(task: str) -> dict[str, Any]:
    """The rsl_rl runner config Isaac Lab registers for the task id ``task``
    (``rsl_rl_cfg_entry_point``), adapted to the installed rsl_rl as Isaac Lab's train script does
    (``handle_deprecated_rsl_rl_cfg``), as a dict; ``rl8.presets.from_rsl_rl`` turns it into
    rl8's hyper-parameters.

    Raises:
        ValueError: The task is not in Isaac Lab's registry.
    """
    import isaaclab_tasks  # noqa: F401  (optional heavy dependency: importing it registers the tasks)
    from isaaclab_rl.rsl_rl import handle_deprecated_rsl_rl_cfg
    from isaaclab_tasks.utils import load_cfg_from_registry

    _check_task(task)
    cfg = load_cfg_from_registry(task, "rsl_rl_cfg_entry_point")
    return handle_deprecated_rsl_rl_cfg(cfg, importlib.metadata.version("rsl-rl-lib")).to_dict()


def _check_task(task: str) -> None:
    tasks = sorted(name for name in gymnasium.registry if name.startswith("Isaac-"))
    if task not in tasks:
        raise ValueError(f"Isaac Lab task {task!r} is not in Isaac Lab's registry; its tasks: {tasks}")


class IsaacLabEnv(RslRlEnv):
    """An Isaac Lab task behind Isaac Lab's ``RslRlVecEnvWrapper``, as an rl8 env
    (:class:`RslRlEnv`), holding the simulation that ``launch_simulation`` started: closing the
    env closes the task, then the simulation (with Isaac Sim's app: the app, which ends the
    process, as Isaac Lab's scripts do).

    Args:
        vec_env: The wrapped task.
        simulation: The entered ``launch_simulation`` context, exited by :meth:`close`.
        **kwargs: :class:`RslRlEnv`'s options.
    """

    def __init__(self, vec_env: Any, simulation: contextlib.ExitStack, **kwargs: Any) -> None:
        super().__init__(vec_env, **kwargs)
        self.simulation = simulation

    def close(self) -> None:
        """Close the task, then the simulation."""
        try:
            super().close()
        finally:
            self.simulation.close()


def make_isaaclab_env(
    task: str,
    num_envs: int,
    horizon: int | None = None,
    *,
    device: torch.device | str,
    presets: str | None = "newton_mjwarp",
    overrides: tuple[str, ...] | list[str] = (),
    seed: int | None = None,
    headless: bool = True,
    ground: bool = True,
    final_obs: bool = False,
    init_at_random_ep_len: bool = True,
    clip_actions: float | None = None,
    env_cfg: Any = None,
) -> IsaacLabEnv:
    """Isaac Lab's task ``task`` on ``num_envs`` envs, as an rl8 env (``PPO("isaaclab:<task>")``).

    The calls of Isaac Lab's own training script: ``parse_env_cfg`` (with the presets and
    overrides), ``launch_simulation`` (kit-less for Newton; Isaac Sim's app where the config
    needs it), ``gymnasium.make``, ``RslRlVecEnvWrapper``. Its observation groups (``policy``,
    and ``critic`` where the task has one) make a ``Dict`` space.

    Args:
        task: An Isaac Lab task id, e.g. ``"Isaac-Cartpole-Direct"``.
        num_envs: Envs simulated together (the config's ``scene.num_envs``).
        horizon: PPO's horizon; unused (the episode length is the task's ``episode_length_s``).
        device: Torch device of the simulation: the CPU or a CUDA device (:func:`isaaclab_device`).
        presets: Isaac Lab's preset selection (``presets=...`` of its scripts), e.g.
            ``"newton_mjwarp"`` (Newton with MuJoCo-Warp, kit-less; the default) or
            ``"newton_mjwarp,newton_renderer"``; ``None``: the task's defaults (PhysX, which
            needs Isaac Sim).
        overrides: More Hydra ``key=value`` overrides of the task's config (``physics=...``).
        seed: The config's ``seed`` (Isaac Lab seeds python, numpy, torch and warp with it);
            ``None``: the config's.
        headless: Start Isaac Sim's app without a window (kit-less runs have none).
        ground: Spawn the task's ground plane; ``False`` drops it (``cfg.scene.ground``), for
            asset roots made by :func:`local_assets`, which have none.
        final_obs: Have the task compute the observations before its resets
            (``cfg.compute_final_obs``) and bootstrap time-outs from them; ``False``: from the
            observation before the step, as rsl_rl does (``docs/simulators.md``).
        init_at_random_ep_len: On every reset, start the envs at random points of their time
            limit (rsl_rl's ``init_at_random_ep_len``, what Isaac Lab's configs ask).
        clip_actions: Actions clipped to ``[-clip_actions, clip_actions]`` by Isaac Lab's wrapper
            (the runner config's ``clip_actions``); ``None``: not clipped.
        env_cfg: An Isaac Lab env config to use instead of the registry's (one changed by hand);
            its ``scene.num_envs``, ``sim.device``, ``seed`` and the options above are set from
            the arguments here. ``task`` then only names the gymnasium id to make.

    Raises:
        ValueError: The task is unknown, or ``device`` is neither the CPU nor CUDA.
        ImportError: Isaac Lab is not installed.
    """
    sim_device = isaaclab_device(device)
    import isaaclab_tasks  # noqa: F401  (optional heavy dependency: importing it registers the tasks)
    from isaaclab.app import launch_simulation
    from isaaclab_rl.rsl_rl import RslRlVecEnvWrapper
    from isaaclab_tasks.utils import parse_env_cfg

    _check_task(task)
    if env_cfg is None:
        selected = [f"presets={presets}"] if presets else []
        env_cfg = parse_env_cfg(
            task, device=sim_device, num_envs=num_envs, overrides=[*selected, *overrides]
        )
    env_cfg.scene.num_envs = num_envs
    env_cfg.sim.device = sim_device
    if seed is not None:
        env_cfg.seed = seed
    if not ground:
        env_cfg.scene.ground = None
    env_cfg.compute_final_obs = final_obs
    simulation = contextlib.ExitStack()
    args = {"headless": headless, "device": sim_device, "verbose": is_verbose()}
    simulation.enter_context(launch_simulation(env_cfg, args))
    try:
        wrapped = RslRlVecEnvWrapper(gymnasium.make(task, cfg=env_cfg), clip_actions=clip_actions)
        return IsaacLabEnv(
            wrapped,
            simulation,
            final_obs_key="final_obs" if final_obs else None,
            init_at_random_ep_len=init_at_random_ep_len,
        )
    except BaseException:
        simulation.close()
        raise
