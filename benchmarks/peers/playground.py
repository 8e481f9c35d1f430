"""rl8 against rsl_rl on MuJoCo Playground's CartpoleBalance (MJX on JAX), in one run.

Env steps per second of collect + update (one training iteration; warm-up iterations, which
compile the JAX step, left out) at 1,024 envs x 24 steps, 5 epochs of 4 minibatches, an MLP
of (64, 64) ELU units, lr 1e-3, fp32:

* ``rl8``: ``PPO(PlaygroundEnv, ...)`` (rl8/envs/jax.py: jit + vmap, DLPack both ways, true
  final observations, fresh resets);
* ``rsl_rl``: rsl_rl's ``OnPolicyRunner`` on Playground's own torch wrapper
  ``RSLRLBraxWrapper`` (``wrap_for_brax_training``: resets to each env's first state; the
  wrapper reads every metric with ``.item()`` each step), the same hyper-parameters;
* ``rl8-gymnax``: rl8 alone on gymnax's CartPole-v1 at PPO's defaults (256 envs x 32 steps).

Each side runs in a fresh process, the sides taking turns round after round; the table gives
the median over rounds and rl8 / rsl_rl with the range of the per-round ratios. rsl_rl
(``rsl-rl-lib``) is imported from ``--rsl-rl-path`` (a folder put first on ``sys.path``), so
it need not be installed beside rl8::

    pip install --no-deps --target /work/venvs/rsl_rl_pkgs rsl-rl-lib tensorboard tensorboard-data-server
    python benchmarks/peers/playground.py --rounds 3 --threads 2

One run (``--rounds 2 --warmup 1 --iters 5 --threads 1``; JAX 0.10.2, rsl-rl-lib 5.5.1,
torch 2.13.0) on this project's 2-core CPU while other jobs kept its load at 12-16, so every
figure is a few times below a quiet machine's and the rounds disagree: rl8 6,481 and 31,531,
rsl_rl 13,258 and 20,024 env steps/s (medians 19,006 and 16,641; rl8 / rsl_rl 1.03x, rounds
0.49-1.57x); rl8 on gymnax CartPole-v1 3,033 and 9,896. Rerun it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
NUM_ENVS, HORIZON, EPOCHS, MINIBATCHES, LR, HIDDENS = 1024, 24, 5, 4, 1e-3, (64, 64)
TASK = {"env_id": "CartpoleBalance", "config_overrides": {"impl": "jax"}}


def run_rl8(warmup: int, iters: int, gymnax: bool) -> tuple[int, float]:
    """``(env steps, seconds)`` of ``iters`` rl8 iterations after ``warmup`` ones."""
    from rl8 import PPO
    from rl8.envs import GymnaxEnv, PlaygroundEnv

    if gymnax:
        algo = PPO(GymnaxEnv, env_kwargs={"env_id": "CartPole-v1"}, seed=0)
    else:
        algo = PPO(PlaygroundEnv, env_kwargs=TASK, seed=0, num_envs=NUM_ENVS, horizon=HORIZON,
                   num_sgd_iters=EPOCHS, num_minibatches=MINIBATCHES, lr=LR, gamma=0.99, gae_lambda=0.95,
                   vf_coeff=1.0, max_grad_norm=1.0, model_config={"hiddens": HIDDENS, "activation": "elu"})
    for i in range(warmup + iters):
        if i == warmup:
            start = time.perf_counter()
        algo.collect()
        algo.update()
    return iters * algo.hparams.num_envs * algo.hparams.horizon, time.perf_counter() - start


def run_rsl_rl(warmup: int, iters: int) -> tuple[int, float]:
    """``(env steps, seconds)`` of ``iters`` iterations of rsl_rl's runner on RSLRLBraxWrapper."""
    import torch
    from mujoco_playground import registry
    from mujoco_playground import wrapper_torch
    from rsl_rl.runners import OnPolicyRunner

    torch.manual_seed(0)
    config = registry.get_default_config(TASK["env_id"])
    env = registry.load(TASK["env_id"], config=config, config_overrides=TASK["config_overrides"])
    vec_env = wrapper_torch.RSLRLBraxWrapper(env, NUM_ENVS, 0, config.episode_length, config.action_repeat)
    # rsl_rl 5's runner reads env.cfg (for its logger) and env.device, which the wrapper lacks on a CPU
    vec_env.cfg, vec_env.device = config.to_dict(), "cpu"
    model = {"class_name": "MLPModel", "hidden_dims": list(HIDDENS), "activation": "elu", "obs_normalization": False}
    cfg = {
        "num_steps_per_env": HORIZON, "save_interval": 10**9,
        "obs_groups": {"actor": ["state"], "critic": ["state"]},
        "algorithm": {
            "class_name": "PPO", "num_learning_epochs": EPOCHS, "num_mini_batches": MINIBATCHES, "clip_param": 0.2,
            "gamma": 0.99, "lam": 0.95, "value_loss_coef": 1.0, "entropy_coef": 0.0, "learning_rate": LR,
            "max_grad_norm": 1.0, "use_clipped_value_loss": True, "schedule": "fixed",
        },
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": model,
    }
    runner = OnPolicyRunner(vec_env, cfg, log_dir=None, device="cpu")
    runner.learn(warmup)
    start = time.perf_counter()
    runner.learn(iters)
    return iters * NUM_ENVS * HORIZON, time.perf_counter() - start


def side(args: argparse.Namespace) -> None:
    """Measure one side in this process and print one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    if args.side == "rsl_rl":
        sys.path.insert(0, args.rsl_rl_path)
        steps, seconds = run_rsl_rl(args.warmup, args.iters)
    else:
        steps, seconds = run_rl8(args.warmup, args.iters, gymnax=args.side == "rl8-gymnax")
    print(json.dumps({"side": args.side, "steps_per_s": steps / seconds, "threads": torch.get_num_threads()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("rl8", "rsl_rl", "rl8-gymnax"), help="measure one side (internal)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (XLA's CPU runs its own pool)")
    parser.add_argument("--rsl-rl-path", default=os.environ.get("RL8_RSL_RL_PATH", "/work/venvs/rsl_rl_pkgs"))
    args = parser.parse_args()
    if args.side:
        side(args)
        return
    sides = ("rl8", "rsl_rl", "rl8-gymnax")
    results: dict[str, list[float]] = {s: [] for s in sides}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for r in range(args.rounds):
        for name in sides[r % 2:] + sides[: r % 2]:
            out = subprocess.run([sys.executable, __file__, "--side", name, "--warmup", str(args.warmup),
                                  "--iters", str(args.iters), "--threads", str(args.threads),
                                  "--rsl-rl-path", args.rsl_rl_path], env=env, capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode or not lines:
                sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
            results[name].append(json.loads(lines[-1])["steps_per_s"])
            print(f"round {r}: {name} {results[name][-1]:,.0f} env steps/s", flush=True)
    ratios = [a / b for a, b in zip(results["rl8"], results["rsl_rl"])]
    print(f"\nCartpoleBalance, {NUM_ENVS} envs x {HORIZON}, torch threads {args.threads}, {args.rounds} rounds:")
    for name in sides:
        print(f"  {name:11s} {statistics.median(results[name]):>10,.0f} env steps/s (median)")
    print(f"  rl8 / rsl_rl {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
