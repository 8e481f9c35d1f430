"""rsl_rl's side of the peers benchmark: its ``OnPolicyRunner`` + ``PPO`` on ``RslPendulum``.

Runs in rsl_rl's virtualenv with the checkout on ``PYTHONPATH`` (for ``rl8.envs``). The
runner's config is rsl_rl's own format, with the workload's hyper-parameters (the same rl8
gets): the fixed learning rate (``schedule="fixed"``: rl8's is constant), advantages
normalised per minibatch (as rl8), no entropy bonus, clipped value loss (rsl_rl's default),
rsl_rl's defaults elsewhere (``check_for_nan=True``; Gaussian policy with a learned scalar
std). ``log_dir=None``: no TensorBoard writer, so no logging cost. Settings: ``fp32`` and
``bf16`` (``use_mixed_precision=True``: bfloat16 autocast of the update), ``symmetry`` and ``rnd``
(fp32 with the ``symmetry_cfg`` or ``rnd_cfg`` of ``workloads.EXTENSIONS``).

    python benchmarks/peers/side_rsl_rl.py pendulum-4096 --setting bf16 --threads 2
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import sys
import time

from workloads import EXTENSIONS, WORKLOADS, batch_size, emit, iterations, parse_side_args, synchronize


def train_cfg(name: str, bf16: bool, extension: str | None = None) -> dict:
    """rsl_rl's runner config for workload ``name`` (``bf16``: ``use_mixed_precision``;
    ``extension``: ``"symmetry"`` or ``"rnd"``, its ``symmetry_cfg`` or ``rnd_cfg`` of
    ``workloads.EXTENSIONS``)."""
    w = WORKLOADS[name]
    model = {
        "class_name": "MLPModel",
        "hidden_dims": list(w["hiddens"]),
        "activation": w["activation"],
        "obs_normalization": False,
    }
    return {
        "num_steps_per_env": w["horizon"],
        "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": w["epochs"],
            "num_mini_batches": w["minibatches"],
            "clip_param": w["clip"],
            "gamma": w["gamma"],
            "lam": w["gae_lambda"],
            "value_loss_coef": w["vf_coeff"],
            "entropy_coef": 0.0,
            "learning_rate": w["lr"],
            "max_grad_norm": w["max_grad_norm"],
            "use_clipped_value_loss": True,
            "schedule": "fixed",
            "normalize_advantage_per_mini_batch": True,
            "use_mixed_precision": bf16,
            "symmetry_cfg": _symmetry_cfg() if extension == "symmetry" else None,
            "rnd_cfg": dict(EXTENSIONS["rnd"]) if extension == "rnd" else None,
        },
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": model,
    }


def _symmetry_cfg() -> dict:
    from rsl_rl_env import mirror_pendulum  # imports rsl_rl: in rsl_rl's virtualenv only, as main's

    return {"data_augmentation_func": mirror_pendulum, **EXTENSIONS["symmetry"]}


class Stop(Exception):
    """Raised from the runner's logging hook when the run has reached its target or its budget."""


def mjlab_main(args) -> None:
    """Train mjlab's task as mjlab's ``train.py`` does (``ManagerBasedRlEnv``, ``RslRlVecEnvWrapper``,
    ``MjlabOnPolicyRunner`` with the task's registered config, ``init_at_random_ep_len=True``; no
    log folder) until the return reaches the target, and print the JSON line of ``emit``."""
    from mjlab_workload import Progress, ReturnTracker, cpu_only, env_cfg, runner_cfg

    cpu_only()
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import MjlabOnPolicyRunner, RslRlVecEnvWrapper

    w = WORKLOADS[args.workload]
    cfg = runner_cfg(w["task"], args.seed)
    tracker = ReturnTracker(w["num_envs"])

    class Tapped(RslRlVecEnvWrapper):
        def step(self, actions):
            out = super().step(actions)
            tracker.add(out[1], out[2])
            return out

    env = Tapped(
        ManagerBasedRlEnv(cfg=env_cfg(w["task"], w["num_envs"], args.seed), device=args.device),
        clip_actions=cfg["clip_actions"],
    )
    runner = MjlabOnPolicyRunner(env, cfg, log_dir=None, device=args.device)
    warmup, iters = iterations(w, args.quick)
    batch = w["num_envs"] * cfg["num_steps_per_env"]
    progress = Progress(batch, w["target"], warmup)
    budget = warmup + iters if args.quick else -(-w["max_env_steps"] // batch)
    log = runner.logger.log

    def log_and_check(**kw) -> None:
        log(**kw)
        if progress.iteration(kw["collect_time"] + kw["learn_time"], tracker.mean()) and not args.quick:
            raise Stop
        if progress.iterations >= budget:
            raise Stop

    runner.logger.log = log_and_check
    try:
        runner.learn(num_learning_iterations=budget, init_at_random_ep_len=True)
    except Stop:
        pass
    result = progress.result(tracker.mean())
    emit(
        result.pop("env_steps"),
        result.pop("seconds"),
        **result,
        seed=args.seed,
        num_envs=w["num_envs"],
        **{
            "rsl-rl-lib": importlib.metadata.version("rsl-rl-lib"),
            "mjlab": importlib.metadata.version("mjlab"),
        },
    )


def main() -> None:
    """Time ``runner.learn`` on one batched workload and print the JSON line of ``emit``."""
    if WORKLOADS.get(sys.argv[1] if len(sys.argv) > 1 else "", {}).get("kind") == "mjlab":
        return mjlab_main(parse_side_args(settings=("auto-reset",)))
    args = parse_side_args(settings=("fp32", "bf16", "symmetry", "rnd"))
    import torch
    from rsl_rl.algorithms import PPO
    from rsl_rl.runners import OnPolicyRunner
    from rsl_rl_env import RslPendulum

    import rl8

    version = importlib.metadata.version("rsl-rl-lib")
    bf16 = args.setting == "bf16"
    if bf16 and "use_mixed_precision" not in inspect.signature(PPO.__init__).parameters:
        print(json.dumps({"unavailable": f"rsl-rl-lib {version} has no use_mixed_precision"}))
        return
    w = WORKLOADS[args.workload]
    torch.manual_seed(0)
    env = RslPendulum(w["num_envs"], device=args.device, seed=0)
    extension = args.setting if args.setting in EXTENSIONS else None
    runner = OnPolicyRunner(
        env, train_cfg(args.workload, bf16, extension), log_dir=None, device=args.device
    )
    warmup, iters = iterations(w, args.quick)
    runner.learn(warmup)
    synchronize(args.device)
    start = time.perf_counter()
    runner.learn(iters)
    synchronize(args.device)
    seconds = time.perf_counter() - start
    emit(
        iters * batch_size(w),
        seconds,
        **{"rsl-rl-lib": version, "rl8_file": rl8.__file__, "device": args.device},
    )


if __name__ == "__main__":
    main()
