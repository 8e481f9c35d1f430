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

``--num-envs``/``--device`` set the size and the torch device (``cuda``: JAX's GPU too);
``--target-return R`` trains on after the timed iterations until the mean return of the
episodes ended in an iteration reaches R or ``--budget`` seconds from the first iteration (JIT
compile included) are spent, and reports the seconds and env steps to R; ``--out`` appends
the table to a file. ``benchmarks/gpu/check.sh`` runs it on the GPU::

    python benchmarks/peers/playground.py --device cuda --num-envs 4096 --sides rl8,rsl_rl --rounds 1 \\
        --target-return 900 --budget 60 --timeout 95 --rsl-rl-path ""

One run (``--rounds 2 --warmup 1 --iters 5 --threads 1``; JAX 0.10.2, rsl-rl-lib 5.5.1,
torch 2.13.0) on this project's 2-core CPU while other jobs kept its load at 12-16, so every
figure is a few times below a quiet machine's and the rounds disagree: rl8 6,481 and 31,531,
rsl_rl 13,258 and 20,024 env steps/s (medians 19,006 and 16,641; rl8 / rsl_rl 1.03x, rounds
0.49-1.57x); rl8 on gymnax CartPole-v1 3,033 and 9,896. Rerun it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
NUM_ENVS, HORIZON, EPOCHS, MINIBATCHES, LR, HIDDENS = 1024, 24, 5, 4, 1e-3, (64, 64)
TASK = {"env_id": "CartpoleBalance", "config_overrides": {"impl": "jax"}}


def train(
    iterate, steps_per_iter: int, warmup: int, iters: int, target: float | None, budget: float
) -> dict:
    """Call ``iterate()`` (one collect + update; returns the mean return of the episodes ended
    so far, NaN before the first) ``warmup + iters`` times, timing the last ``iters``; with a
    ``target`` return, go on until it is reached or ``budget`` seconds from the first call are
    spent. ``steps_per_s``, and ``seconds_to_return``/``steps_to_return`` when it is reached."""
    start = time.perf_counter()
    result: dict = {"target": target, "budget_s": budget}
    i = 0
    while True:
        if i == warmup:
            timed = time.perf_counter()
        mean_return = iterate()
        i += 1
        if i == warmup + iters:
            result["steps_per_s"] = iters * steps_per_iter / (time.perf_counter() - timed)
        elapsed = time.perf_counter() - start
        if target is not None and "seconds_to_return" not in result and mean_return >= target:
            result.update(seconds_to_return=elapsed, steps_to_return=i * steps_per_iter)
        if i >= warmup + iters and (target is None or "seconds_to_return" in result or elapsed > budget):
            result.update(iterations=i, seconds=elapsed, last_return=mean_return)
            return result


def run_rl8(
    warmup: int,
    iters: int,
    gymnax: bool,
    num_envs: int = NUM_ENVS,
    device: str = "cpu",
    target: float | None = None,
    budget: float = 0.0,
) -> dict:
    """:func:`train` with rl8 (``num_envs`` envs on torch ``device``)."""
    from rl8 import PPO
    from rl8.envs import GymnaxEnv, PlaygroundEnv

    if gymnax:
        algo = PPO(GymnaxEnv, env_kwargs={"env_id": "CartPole-v1"}, seed=0, device=device)
    else:
        algo = PPO(
            PlaygroundEnv,
            env_kwargs=TASK,
            seed=0,
            num_envs=num_envs,
            horizon=HORIZON,
            device=device,
            num_sgd_iters=EPOCHS,
            num_minibatches=MINIBATCHES,
            lr=LR,
            gamma=0.99,
            gae_lambda=0.95,
            vf_coeff=1.0,
            max_grad_norm=1.0,
            model_config={"hiddens": HIDDENS, "activation": "elu"},
        )
    last = [float("nan")]

    def iterate() -> float:
        ended = algo.collect().get("episodes/return_mean", float("nan"))
        algo.update()
        last[0] = last[0] if math.isnan(ended) else ended
        return last[0]

    return train(iterate, algo.hparams.num_envs * algo.hparams.horizon, warmup, iters, target, budget)


def run_rsl_rl(
    warmup: int,
    iters: int,
    num_envs: int = NUM_ENVS,
    device: str = "cpu",
    target: float | None = None,
    budget: float = 0.0,
) -> dict:
    """:func:`train` with rsl_rl's runner on RSLRLBraxWrapper (``num_envs`` envs on ``device``)."""
    import torch
    from mujoco_playground import registry, wrapper_torch
    from rsl_rl.runners import OnPolicyRunner

    torch.manual_seed(0)
    config = registry.get_default_config(TASK["env_id"])
    env = registry.load(TASK["env_id"], config=config, config_overrides=TASK["config_overrides"])
    rank = torch.device(device).index or 0 if torch.device(device).type == "cuda" else None
    vec_env = wrapper_torch.RSLRLBraxWrapper(
        env, num_envs, 0, config.episode_length, config.action_repeat, device_rank=rank
    )
    # rsl_rl 5's runner reads env.cfg (for its logger) and env.device, which the wrapper lacks on a CPU
    vec_env.cfg, vec_env.device = config.to_dict(), device
    sums, ended, env_step, latest = (
        torch.zeros(3, num_envs, device=device),
        [float("nan")],
        vec_env.step,
        [],
    )

    def step(
        action,
    ):  # the episode returns (sum, count of the ended ones), which rsl_rl keeps only when it logs
        obs, reward, done, extras = env_step(action)
        over = done.flatten() > 0
        sums[0] += reward.flatten()
        sums[1] += sums[0] * over
        sums[2] += over
        sums[0] *= ~over
        latest[:] = [obs]
        return obs, reward, done, extras

    # the wrapper's get_observations resets every env, and runner.learn calls it first: reset once only
    vec_env.step, vec_env.get_observations = step, lambda: latest[0] if latest else vec_env.reset()
    model = {
        "class_name": "MLPModel",
        "hidden_dims": list(HIDDENS),
        "activation": "elu",
        "obs_normalization": False,
    }
    cfg = {
        "num_steps_per_env": HORIZON,
        "save_interval": 10**9,
        "obs_groups": {"actor": ["state"], "critic": ["state"]},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": EPOCHS,
            "num_mini_batches": MINIBATCHES,
            "clip_param": 0.2,
            "gamma": 0.99,
            "lam": 0.95,
            "value_loss_coef": 1.0,
            "entropy_coef": 0.0,
            "learning_rate": LR,
            "max_grad_norm": 1.0,
            "use_clipped_value_loss": True,
            "schedule": "fixed",
        },
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": model,
    }
    runner = OnPolicyRunner(vec_env, cfg, log_dir=None, device=device)

    def iterate() -> float:
        runner.learn(1)
        total, count = sums[1:].sum(dim=1).tolist()
        sums[1:] = 0
        ended[0] = total / count if count else ended[0]
        return ended[0]

    return train(iterate, num_envs * HORIZON, warmup, iters, target, budget)


def side(args: argparse.Namespace) -> None:
    """Measure one side in this process and print one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    size = {
        "num_envs": args.num_envs,
        "device": args.device,
        "target": args.target_return,
        "budget": args.budget,
    }
    if args.side == "rsl_rl":
        if args.rsl_rl_path:
            sys.path.insert(0, args.rsl_rl_path)
        result = run_rsl_rl(args.warmup, args.iters, **size)
    elif args.side == "rl8-gymnax":
        result = run_rl8(args.warmup, args.iters, gymnax=True, device=args.device)
    else:
        result = run_rl8(args.warmup, args.iters, gymnax=False, **size)
    print(json.dumps({"side": args.side, "threads": torch.get_num_threads(), **result}))


def measure(name: str, args: argparse.Namespace) -> dict:
    """One side in a fresh process (stopped after ``--timeout`` s): its JSON line or ``{"error": ...}``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        __file__,
        "--side",
        name,
        *(
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("side", "sides", "rounds", "out", "timeout") and v is not None
        ),
    ]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {args.timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        err = [ln for ln in out.stderr.splitlines() if ln.strip()] or ["no output"]
        return {"error": f"exit {out.returncode}: {err[-1][:300]}"}
    return json.loads(lines[-1])


def table(results: dict[str, list[dict]], args: argparse.Namespace) -> list[str]:
    """A Markdown table: per side the median env steps/s (collect + update) and, with
    ``--target-return``, the median seconds and env steps to it (first iteration's compile included)."""

    def median(runs: list[dict], key: str) -> float | None:
        got = [r[key] for r in runs if key in r]
        return statistics.median(got) if got else None

    lines = [
        f'CartpoleBalance (MuJoCo Playground, MJX `impl="jax"`), {args.num_envs:,} envs x {HORIZON} steps, '
        f"{args.device}, {args.rounds} round(s); time to return {args.target_return} within {args.budget:.0f} s",
        "",
        "| side | env steps/s | s to return | env steps to return | last return | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, runs in results.items():
        rate, secs, steps = (
            median(runs, k) for k in ("steps_per_s", "seconds_to_return", "steps_to_return")
        )
        errors = "; ".join(r["error"] for r in runs if "error" in r)
        unreached = [r for r in runs if "error" not in r and "seconds_to_return" not in r]
        note = errors or (
            f"not reached in {len(unreached)} run(s) ({unreached[0]['seconds']:.0f} s, "
            f"{unreached[0]['iterations']} iterations)"
            if unreached and args.target_return is not None
            else ""
        )
        last = median(runs, "last_return")
        lines.append(
            f"| {name} | {f'{rate:,.0f}' if rate else ''} | {f'{secs:.1f}' if secs else ''} | "
            f"{f'{steps:,.0f}' if steps else ''} | {f'{last:.0f}' if last is not None and last == last else ''} | {note} |"
        )
    rl8, rsl = (median(results.get(k, []), "steps_per_s") for k in ("rl8", "rsl_rl"))
    if rl8 and rsl:
        lines += ["", f"rl8 / rsl_rl env steps/s: {rl8 / rsl:.2f}x"]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure the sides round after round, print the table (and write it to ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--side", choices=("rl8", "rsl_rl", "rl8-gymnax"), help="measure one side (internal)"
    )
    parser.add_argument(
        "--sides", default="rl8,rsl_rl,rl8-gymnax", help="the sides measured, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (XLA's CPU runs its own pool)"
    )
    parser.add_argument(
        "--num-envs",
        type=int,
        default=NUM_ENVS,
        help=f"envs of the Playground sides (default {NUM_ENVS})",
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device (cuda: JAX's GPU too; default cpu)"
    )
    parser.add_argument(
        "--target-return", type=float, help="also train on to this mean episode return (e.g. 900)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="seconds per side to reach --target-return (default 60)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one side's process may take (default 600)"
    )
    parser.add_argument("--out", type=Path, help="append the table (Markdown) to this file")
    parser.add_argument(
        "--rsl-rl-path",
        default=os.environ.get("RL8_RSL_RL_PATH", "/work/venvs/rsl_rl_pkgs"),
        help="a folder put first on sys.path for rsl_rl ('' for none)",
    )
    args = parser.parse_args(argv)
    if args.side:
        side(args)
        return 0
    sides = args.sides.split(",")
    results: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for name in sides[r % 2 :] + sides[: r % 2]:
            results[name].append(measure(name, args))
            print(f"round {r}: {name} {results[name][-1]}", file=sys.stderr, flush=True)
    text = "\n".join(table(results, args))
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
