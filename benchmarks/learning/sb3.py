"""Stable-Baselines3's PPO with its rl-baselines3-zoo hyper-parameters, timed as run.py times rl8.

Run (from the repository root; SB3 is a reference here, never an rl8 dependency)::

    python -m benchmarks.learning.sb3 CartPole-v1 Pendulum-v1 --seeds 3
    python -m benchmarks.learning.run --report       # adds SB3's columns and curves
    python -m benchmarks.learning.sb3 Hopper-v5 --seeds 1 --stop-at-threshold  # only the time to threshold
    python -m benchmarks.learning.sb3 Ant-v5 --seeds 1 --stop-at-threshold --max-wall-s 1500

Writes ``OUT/curves/sb3/PRESET/seed-S.csv`` in run.py's format: env steps, training wall time
and the deterministic evaluation's mean return, measured as run.py measures rl8:

* **Wall time**: the time since ``model.learn`` started (building the model and its envs left
  out), evaluations left out.
* **Evaluations**: at the start of the first rollout at or after every multiple of the task's
  ``eval_every`` env steps (``references.py``, the number run.py uses; SB3 can only be
  evaluated between updates, so where a rollout is longer, at every rollout), and at the end.
  Each runs the deterministic policy on 10 envs for one whole episode each (as the presets'
  ``eval_num_envs: 10``), reseeded to the same starts every time (as rl8 puts its eval env back
  in its first state).

``torch.set_num_threads(--threads)``, default 1, as run.py. ``--max-steps`` is for quick checks
only: SB3's linear schedules (``lin_X``) decay over the run's ``total_timesteps``, so a shorter
run is not the zoo's training (rl8's presets schedule over fixed env steps instead).

The hyper-parameters are rl-baselines3-zoo's ``hyperparams/ppo.yml`` (commit 22e3ff2, April
2026), written out below; ``lin_X`` is a learning rate or clip range decaying linearly from X to 0.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from benchmarks.learning.references import TASKS
from benchmarks.learning.run import DEFAULT_OUT, next_eval_at, write_curve


def _linear(start: float) -> Any:
    return lambda progress_remaining: progress_remaining * start


#: The zoo's policy for its tuned MuJoCo tasks: separate 256 x 256 ReLU networks, an initial
#: log-std of -2, no orthogonal initialisation.
_ZOO_MUJOCO_NET = dict(
    log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256])
)

#: (n_envs, n_timesteps, PPO keyword arguments) per task.
ZOO: dict[str, tuple[int, int, dict[str, Any]]] = {
    "CartPole-v1": (
        8,
        100_000,
        dict(
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=_linear(1e-3),
            clip_range=_linear(0.2),
        ),
    ),
    "Pendulum-v1": (
        4,
        100_000,
        dict(
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        ),
    ),
    # The zoo tunes the MuJoCo v3 tasks; gymnasium has v5 of them now (same bodies and rewards).
    "HalfCheetah-v5": (
        1,
        1_000_000,
        dict(
            n_steps=512,
            batch_size=64,
            gamma=0.98,
            learning_rate=2.0633e-05,
            ent_coef=0.000401762,
            clip_range=0.1,
            n_epochs=20,
            gae_lambda=0.92,
            max_grad_norm=0.8,
            vf_coef=0.58096,
            policy_kwargs=_ZOO_MUJOCO_NET,
        ),
    ),
    "Hopper-v5": (
        1,
        1_000_000,
        dict(
            n_steps=512,
            batch_size=32,
            gamma=0.999,
            learning_rate=9.80828e-05,
            ent_coef=0.00229519,
            clip_range=0.2,
            n_epochs=5,
            gae_lambda=0.99,
            max_grad_norm=0.7,
            vf_coef=0.835671,
            policy_kwargs=_ZOO_MUJOCO_NET,
        ),
    ),
    "Walker2d-v5": (
        1,
        1_000_000,
        dict(  # no policy_kwargs: SB3's 64 x 64 tanh MlpPolicy
            n_steps=512,
            batch_size=32,
            gamma=0.99,
            learning_rate=5.05041e-05,
            ent_coef=0.000585045,
            clip_range=0.1,
            n_epochs=20,
            gae_lambda=0.95,
            max_grad_norm=1.0,
            vf_coef=0.871923,
        ),
    ),
    # Ant-v3 is the zoo's "mujoco-defaults": SB3's PPO defaults (2048 steps, batch 64, 10 epochs,
    # lr 3e-4, 64 x 64 tanh) with normalisation.
    "Ant-v5": (1, 1_000_000, dict()),
    # The zoo trains Humanoid-v3 for 1e7 steps; compared here at 1M, as CleanRL's mean.
    "Humanoid-v5": (
        1,
        1_000_000,
        dict(
            n_steps=512,
            batch_size=256,
            gamma=0.95,
            learning_rate=3.56987e-05,
            ent_coef=0.00238306,
            clip_range=0.3,
            n_epochs=5,
            gae_lambda=0.9,
            max_grad_norm=2.0,
            vf_coef=0.431892,
            policy_kwargs=_ZOO_MUJOCO_NET,
        ),
    ),
}
#: Envs of the evaluation env: one whole episode each per evaluation.
EVAL_EPISODES = 10

#: Tasks the zoo trains with ``normalize: true``: observations and rewards normalised by
#: ``VecNormalize`` (evaluations see normalised observations and raw rewards).
NORMALIZED = {"HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"}

#: ``gymnasium.make`` arguments, the same as rl8's preset for the task gives its env, so that
#: both sides learn the same task (Ant-v5: without the 78 contact forces in the observation).
ENV_KWARGS: dict[str, dict[str, Any]] = {"Ant-v5": {"include_cfrc_ext_in_observation": False}}


def train(
    task: str,
    seed: int,
    *,
    out: Path,
    threads: int = 1,
    max_steps: int | None = None,
    stop_at_threshold: bool = False,
    max_wall_s: float | None = None,
) -> Path:
    """Train SB3's PPO on ``task`` with the zoo's hyper-parameters and ``seed``; write the curve
    to ``out/curves/sb3/TASK/seed-SEED.csv`` and return its path.

    Args:
        task: A key of :data:`ZOO`.
        seed: SB3's seed (the eval env's is ``seed + 1000``).
        out: Results folder.
        threads: ``torch.set_num_threads`` for the run.
        max_steps: Env steps (default: the zoo's ``n_timesteps``).
        stop_at_threshold: End training at the first evaluation at or above the task's
            threshold (``references.py``): enough for the table's SB3 wall time to threshold.
        max_wall_s: End training at the first evaluation after this many seconds of training
            wall time (as the curve counts it). Enough to bound the table's rl8 / SB3 ratio
            when SB3 has not reached the threshold by then: the ratio is below rl8's time over
            this run's.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(threads)
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

    n_envs, n_timesteps, kwargs = ZOO[task]
    eval_every = TASKS[task].eval_every
    env_kwargs = ENV_KWARGS.get(task)
    env = make_vec_env(task, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs)
    eval_env = make_vec_env(task, n_envs=EVAL_EPISODES, seed=seed + 1000, env_kwargs=env_kwargs)
    if task in NORMALIZED:
        env = VecNormalize(env)
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
    model = PPO("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **kwargs)
    path = out / "curves" / "sb3" / task / f"seed-{seed}.csv"
    rows: list[dict[str, float]] = []
    clock = {"start": time.perf_counter(), "eval_s": 0.0, "next_eval": eval_every, "stop": False}

    def evaluate(steps: int) -> None:
        t0 = time.perf_counter()
        if task in NORMALIZED:
            sync_envs_normalization(env, eval_env)  # the training env's observation statistics
        eval_env.seed(seed + 1000)  # the same episode starts at every evaluation
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
        wall_s = t0 - clock["start"] - clock["eval_s"]
        rows.append(
            {"env_steps": steps, "wall_s": wall_s, "train_return": math.nan, "eval_return": float(mean)}
        )
        write_curve(path, rows)  # after every evaluation, so that a stopped run keeps its curve
        clock["eval_s"] += time.perf_counter() - t0
        print(
            f"sb3 {task} seed {seed}: {steps} env steps, {wall_s:.0f} s, eval return {mean:.1f}",
            flush=True,
        )
        reached = stop_at_threshold and mean >= TASKS[task].threshold
        clock["stop"] = reached or (max_wall_s is not None and wall_s >= max_wall_s)

    class EvalEvery(BaseCallback):
        def _on_rollout_start(self) -> None:
            if self.num_timesteps >= clock["next_eval"]:
                clock["next_eval"] = next_eval_at(self.num_timesteps, eval_every)
                evaluate(self.num_timesteps)

        def _on_step(self) -> bool:
            return not clock["stop"]

    clock["start"] = time.perf_counter()
    model.learn(total_timesteps=max_steps or n_timesteps, callback=EvalEvery())
    if not clock["stop"]:  # else its last evaluation ended it
        evaluate(model.num_timesteps)
    env.close()
    eval_env.close()
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="+", choices=sorted(ZOO))
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (default 3)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--max-steps",
        type=int,
        help="env steps per run (default: the zoo's n_timesteps; "
        "a shorter run also shortens the zoo's linear lr and clip schedules)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--stop-at-threshold",
        action="store_true",
        help="end each run at its first evaluation at or above the task's threshold",
    )
    parser.add_argument(
        "--max-wall-s",
        type=float,
        metavar="SECONDS",
        help="end each run at its first evaluation after this much training wall time",
    )
    args = parser.parse_args(argv)
    for task in args.tasks:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            train(
                task,
                seed,
                out=args.out,
                threads=args.threads,
                max_steps=args.max_steps,
                stop_at_threshold=args.stop_at_threshold,
                max_wall_s=args.max_wall_s,
            )


if __name__ == "__main__":
    main()
