"""Isaac Lab 3.0's ``Isaac-Cartpole-Direct`` trained by rl8 and by rsl_rl 5.5.1 through Isaac
Lab's own rsl_rl path, kit-less (Newton with the MuJoCo-Warp solver, warp on the CPU), side by
side, in one run.

Both sides get the same task, envs and hyper-parameters: the rsl_rl runner config Isaac Lab
registers for the task, adapted to rsl_rl 5.5.1 as Isaac Lab's train script does
(``handle_deprecated_rsl_rl_cfg``); rl8's through ``rl8.presets.from_rsl_rl``
(``rl8.envs.isaaclab.isaaclab_runner_cfg``). rsl_rl's side is Isaac Lab's ``isaaclab train
--rl_library rsl_rl`` as a function: ``resolve_task_config``, ``launch_simulation``,
``gymnasium.make``, ``RslRlVecEnvWrapper(clip_actions=...)``, ``create_rsl_rl_runner``,
``runner.learn(init_at_random_ep_len=...)`` (no log folder); rl8's is
``PPO("isaaclab:...")``'s env (``make_isaaclab_env``) and ``collect()`` + ``update()``. Each
run is a fresh process; the sides take turns seed after seed (the first side alternates), so
that the load of other processes falls on both alike.

Per run: env steps/s of whole iterations (collect + update, after 2 warm-up iterations), and
the return (rsl_rl's "Mean reward": the mean return of the last 100 episodes that ended, with
the task's own rewards) after the same budget of env steps. Then, per seed, the env steps each
side took to first reach rsl_rl's return: 95% of the way from rsl_rl's first return to its last
(the returns start below 0).

Every Isaac Lab task loads its USD assets from NVIDIA's cloud; where that cannot be reached the
cartpole is cut out of the wheel's test stages into a local asset root
(``rl8.envs.isaaclab.local_assets``; the ground plane, absent there, is left out of the scene
on both sides: it touches nothing of the cartpole, which hangs on its rail).

The virtualenv is made on first use under ``$RL8_PEERS_VENVS`` (``benchmarks/peers/run.py``'s
helper; default ``/tmp/rl8-peers``), with Python 3.12 (``--python``): ``torch==2.11.0`` (Isaac
Lab's pin) first, then ``isaaclab==3.0.0`` (which brings rsl-rl-lib 5.5.1, tensordict, warp,
Newton and MuJoCo-Warp; about 11 minutes and 2.9 GB) and rl8's own dependencies; rl8 is this
checkout, on ``PYTHONPATH``. Warp compiles its kernels on the first run (about 4 minutes) and
loads them from its cache after that.

Usage (from the repository root, with any Python that runs rl8)::

    python benchmarks/sims/isaaclab.py                               # 3 seeds, 100 iterations each
    python benchmarks/sims/isaaclab.py --seeds 1 --iterations 4      # a try
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# this file's folder leaves the path: run as a script, this file would be `import isaaclab`
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import run as peers  # noqa: E402  (benchmarks/peers/run.py: the venv helper, one side's run)
from mjlab_workload import Progress, ReturnTracker, rl8_iteration  # noqa: E402

TASK = "Isaac-Cartpole-Direct"
PRESETS = "newton_mjwarp"
WARMUP = 2  # iterations left out of env steps/s: warp's first launches, first touches
TARGET_SHARE = 0.95  # of rsl_rl's gain, first to last return: the return both sides are timed to
ISAACLAB_VENV = peers.Venv(
    "isaaclab",
    (
        "isaaclab==3.0.0",
        "mlflow-skinny==3.17.2",
        "sqlalchemy>=1.4,<3",
        "alembic>=1.0,<2",
        "gymnasium>=1.0",
        "pyyaml>=6.0",
    ),
    "isaaclab",
    torch="torch==2.11.0",
    python="python3.12",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1, one round each")
    parser.add_argument("--iterations", type=int, default=100, help="iterations of each run")
    parser.add_argument("--num-envs", type=int, default=256, help="envs simulated together")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    parser.add_argument("--python", default="python3.12", help="the Python 3.12 that makes the venv")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    parser.add_argument("--side", choices=("rl8", "rsl_rl"), help=argparse.SUPPRESS)  # one run
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------
# one run, in the Isaac Lab venv


def rsl_rl_run(args: argparse.Namespace, progress, tracker) -> None:
    """rsl_rl's side: Isaac Lab's rsl_rl train script's calls, the iterations timed by rsl_rl's
    own ``collect_time`` and ``learn_time`` (read from the runner's logging call)."""
    import gymnasium
    import isaaclab_tasks  # noqa: F401  (registers the tasks)
    from isaaclab.app import launch_simulation
    from isaaclab_rl.rsl_rl import (
        RslRlVecEnvWrapper,
        check_rsl_rl_version,
        create_rsl_rl_runner,
        handle_deprecated_rsl_rl_cfg,
    )
    from isaaclab_tasks.utils import resolve_task_config

    env_cfg, agent_cfg = resolve_task_config(
        TASK, "rsl_rl_cfg_entry_point", overrides=[f"presets={PRESETS}"]
    )
    agent_cfg = handle_deprecated_rsl_rl_cfg(agent_cfg, check_rsl_rl_version())
    agent_cfg.seed, agent_cfg.device = args.seed, "cpu"
    env_cfg.seed, env_cfg.sim.device = agent_cfg.seed, "cpu"
    env_cfg.scene.num_envs = args.num_envs
    env_cfg.scene.ground = None

    class Tapped(RslRlVecEnvWrapper):
        def step(self, actions):
            out = super().step(actions)
            tracker.add(out[1], out[2])
            return out

    class Stop(Exception):
        pass

    with launch_simulation(env_cfg, {"headless": True, "device": "cpu"}):
        env = Tapped(gymnasium.make(TASK, cfg=env_cfg), clip_actions=agent_cfg.clip_actions)
        runner = create_rsl_rl_runner(env, agent_cfg, log_dir=None)
        log = runner.logger.log

        def log_and_count(**kw) -> None:
            log(**kw)
            progress.iteration(kw["collect_time"] + kw["learn_time"], tracker.mean())
            if progress.iterations >= args.iterations:
                raise Stop

        runner.logger.log = log_and_count
        try:
            runner.learn(
                num_learning_iterations=args.iterations,
                init_at_random_ep_len=agent_cfg.init_at_random_ep_len,
            )
        except Stop:
            pass
        env.close()


def rl8_run(args: argparse.Namespace, progress, tracker) -> None:
    """rl8's side: ``make_isaaclab_env`` (what ``PPO("isaaclab:...")`` builds) with the task's
    runner config through ``from_rsl_rl``; collect + update timed with ``perf_counter``."""
    from rl8 import PPO
    from rl8.envs.isaaclab import isaaclab_runner_cfg, make_isaaclab_env
    from rl8.presets import from_rsl_rl

    cfg = isaaclab_runner_cfg(TASK)
    env = make_isaaclab_env(
        TASK,
        args.num_envs,
        device="cpu",
        presets=PRESETS,
        seed=args.seed,
        ground=False,
        clip_actions=cfg["clip_actions"],
        init_at_random_ep_len=cfg["init_at_random_ep_len"],
    )
    algo = PPO(env, **{**from_rsl_rl(cfg).hparams, "seed": args.seed})
    while progress.iterations < args.iterations:
        progress.iteration(rl8_iteration(algo, tracker), tracker.mean())
    algo.close()


def one_run(args: argparse.Namespace) -> None:
    """Train one side for ``args.iterations`` iterations and print its JSON line."""
    import torch

    import rl8
    from rl8.envs.isaaclab import local_assets

    torch.set_num_threads(args.threads)
    local_assets(os.environ["ISAACSIM_ASSET_ROOT"])
    batch = args.num_envs * 16  # the task's num_steps_per_env
    progress = Progress(
        batch, float("inf"), WARMUP
    )  # the target is set afterwards, from rsl_rl's return
    tracker = ReturnTracker(args.num_envs)
    (rsl_rl_run if args.side == "rsl_rl" else rl8_run)(args, progress, tracker)
    result = progress.result(tracker.mean())
    timed = result.pop("env_steps")
    del result["target"], result["env_steps_to_target"], result["seconds_to_target"]
    print(
        json.dumps(
            {
                **result,
                "steps_per_s": timed / result.pop("seconds"),
                "side": args.side,
                "seed": args.seed,
                "batch": batch,
                "torch": torch.__version__,
                "rsl-rl-lib": importlib.metadata.version("rsl-rl-lib"),
                "isaaclab": importlib.metadata.version("isaaclab"),
                "rl8_file": rl8.__file__,
            }
        ),
        flush=True,
    )


# --------------------------------------------------------------------------------------------
# the table, in this Python


def steps_to(returns: list[float], target: float, batch: int) -> int | None:
    """Env steps to the first iteration whose return reached ``target`` (``None``: never)."""
    return next(((i + 1) * batch for i, r in enumerate(returns) if r >= target), None)


def table(results: dict[tuple[str, int], dict], seeds: int) -> list[str]:
    """The Markdown table: per seed, both sides' env steps/s, returns, and the env steps to 95%
    of the way from rsl_rl's first return to its last."""
    out = [
        "| seed | rsl_rl env steps/s | rl8 env steps/s | rl8 / rsl_rl | rsl_rl return | rl8 return "
        f"| target ({TARGET_SHARE:.0%} of rsl_rl's gain) | rsl_rl env steps to it | rl8 env steps to it |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed in range(seeds):
        rsl, ours = results[("rsl_rl", seed)], results[("rl8", seed)]
        if "error" in rsl or "error" in ours:
            out.append(f"| {seed} | {rsl.get('error', '')} | {ours.get('error', '')} |||||||")
            continue
        first = rsl["returns"][0]
        target = first + TARGET_SHARE * (rsl["final_return"] - first)
        reach = [steps_to(r["returns"], target, r["batch"]) for r in (rsl, ours)]
        out.append(
            f"| {seed} | {peers.fmt_rate(rsl['steps_per_s'])} | {peers.fmt_rate(ours['steps_per_s'])} "
            f"| {ours['steps_per_s'] / rsl['steps_per_s']:.2f}x | {rsl['final_return']:.2f} "
            f"| {ours['final_return']:.2f} | {target:.2f} | "
            + " | ".join("not reached" if n is None else f"{n:,}" for n in reach)
            + " |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        one_run(args)
        return 0
    python, reason = peers.ensure_venv(dataclasses.replace(ISAACLAB_VENV, python=args.python), print)
    if python is None:
        print(f"the Isaac Lab venv could not be made: {reason}", file=sys.stderr)
        return 1
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'benchmarks' / 'peers'}",
        OMP_NUM_THREADS=str(args.threads),
        CUDA_VISIBLE_DEVICES="",  # warp on its CPU device
        ISAACSIM_ASSET_ROOT=str(peers.venvs_dir() / ISAACLAB_VENV.name / "assets"),
    )
    results: dict[tuple[str, int], dict] = {}
    for seed in range(args.seeds):
        order = ("rsl_rl", "rl8") if seed % 2 == 0 else ("rl8", "rsl_rl")
        for side in order:
            cmd = [str(python), str(Path(__file__).resolve()), "--side", side, "--seed", str(seed)]
            cmd += ["--iterations", str(args.iterations), "--num-envs", str(args.num_envs)]
            cmd += ["--threads", str(args.threads)]
            start = time.perf_counter()
            result = peers.run_side(cmd, env, args.timeout)
            if "rl8_file" in result and not result["rl8_file"].startswith(str(ROOT / "rl8")):
                result = {"error": f"imported rl8 from {result['rl8_file']}, not from {ROOT}"}
            results[(side, seed)] = result
            print(
                f"seed {seed} {side}: {time.perf_counter() - start:.0f} s, "
                + json.dumps({k: v for k, v in result.items() if k != "returns"}),
                flush=True,
            )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    first = next((r for r in results.values() if "torch" in r), {})
    print()
    print(
        f"Isaac Lab {first.get('isaaclab', '?')} {TASK}, presets={PRESETS}, kit-less on the CPU; "
        f"{args.num_envs} envs, {args.iterations} iterations of {args.num_envs * 16:,} env steps; "
        f"rsl-rl-lib {first.get('rsl-rl-lib', '?')}, torch {first.get('torch', '?')}, "
        f"{args.threads} torch thread(s); {peers.cpu_model()}, {os.cpu_count()} cores, load "
        f"average {load:.1f} at the end; rl8 {peers.rl8_commit()}; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    print("\n".join(table(results, args.seeds)))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
