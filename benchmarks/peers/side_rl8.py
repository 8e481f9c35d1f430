"""rl8's side of the peers benchmark: ``PPO.collect()`` + ``PPO.update()`` on a workload.

Runs in rl8's own environment with the checkout first on ``PYTHONPATH`` (``run.py`` sets it
and checks that the rl8 imported is the checkout's). Settings: ``fp32``, ``bf16``
(``enable_amp=True``: bfloat16 autocast on CPU, float16 with a gradient scaler on CUDA), where this rl8 has the ``compile``
hyper-parameter, ``compile`` and ``compile-bf16``, and for the batched workloads ``symmetry``
and ``rnd`` (fp32 with hparam ``symmetry`` or ``rnd``, ``workloads.EXTENSIONS``).

    python benchmarks/peers/side_rl8.py pendulum-4096 --setting bf16 --threads 2
"""

from __future__ import annotations

import dataclasses
import sys
import time

from workloads import (
    EXTENSIONS,
    PENDULUM_STEP_DT,
    WORKLOADS,
    batch_size,
    emit,
    iterations,
    parse_side_args,
    synchronize,
)

SETTINGS = ("fp32", "bf16", "compile", "compile-bf16", "symmetry", "rnd")
MJLAB_SETTINGS = ("auto-reset", "partial-reset")


def has_compile() -> bool:
    """Whether this rl8's PPO has a ``compile`` hyper-parameter."""
    from rl8 import HParams

    return "compile" in {f.name for f in dataclasses.fields(HParams)}


def hparams(name: str, setting: str, device: str = "cpu") -> dict:
    """rl8's hyper-parameters for workload ``name`` in ``setting`` (see :data:`SETTINGS`) on the
    torch ``device``."""
    w = WORKLOADS[name]
    hp = dict(
        num_envs=w["num_envs"],
        horizon=w["horizon"],
        num_sgd_iters=w["epochs"],
        num_minibatches=w["minibatches"],
        lr=w["lr"],
        gamma=w["gamma"],
        gae_lambda=w["gae_lambda"],
        clip_param=w["clip"],
        vf_coeff=w["vf_coeff"],
        entropy_coeff=0.0,
        max_grad_norm=w["max_grad_norm"],
        normalize_advantages=True,
        normalize_rewards=False,
        model_config={"hiddens": tuple(w["hiddens"]), "activation": w["activation"]},
        enable_amp=setting.endswith("bf16"),
        device=device,
        seed=0,
    )
    if w["kind"] == "batched":
        hp["vf_clip_param"] = w["clip"]  # rsl_rl's default use_clipped_value_loss=True
    else:
        hp["env_kwargs"] = {"vectorization_mode": "sync"}
    if setting.startswith("compile"):
        hp["compile"] = True
    if setting == "symmetry":
        from rl8.envs import Pendulum

        hp["symmetry"] = {"data_augmentation_func": Pendulum.mirror, **EXTENSIONS["symmetry"]}
    if setting == "rnd":  # rsl_rl's weight times the pendulum's step_dt, as rsl_rl scales it
        rnd = EXTENSIONS["rnd"]
        hp["rnd"] = {**rnd, "weight": rnd["weight"] * PENDULUM_STEP_DT}
    return hp


def mjlab_main(args) -> None:
    """Train mjlab's task through ``rl8.envs.mjlab`` with the runner config mjlab ships for it,
    carried over by ``rl8.presets.from_rsl_rl`` (adaptive learning rate included), until the
    return reaches the target, and print the JSON line of ``emit``. ``--setting``: the reset
    mode (``auto-reset``: mjlab resets inside ``step``, time-outs bootstrap from the pre-step
    observation as in rsl_rl; ``partial-reset``: ``auto_reset=False``, true final observations,
    ``reset(env_ids)``)."""
    from mjlab_workload import Progress, ReturnTracker, cpu_only, rl8_iteration, runner_cfg

    cpu_only()
    import rl8
    from rl8 import PPO
    from rl8.envs.mjlab import make_mjlab_env
    from rl8.presets import from_rsl_rl

    w = WORKLOADS[args.workload]
    cfg = runner_cfg(w["task"], args.seed)
    hp = {**from_rsl_rl(cfg).hparams, "seed": args.seed, "device": args.device}
    env = make_mjlab_env(
        w["task"],
        w["num_envs"],
        device=args.device,
        seed=args.seed,
        reset_mode=args.setting.removesuffix("-reset"),
        clip_actions=cfg["clip_actions"],
    )
    algo = PPO(env, **hp)
    tracker = ReturnTracker(w["num_envs"])
    warmup, iters = iterations(w, args.quick)
    batch = w["num_envs"] * algo.hparams.horizon
    progress = Progress(batch, w["target"], warmup)
    budget = warmup + iters if args.quick else -(-w["max_env_steps"] // batch)
    while progress.iterations < budget:
        if progress.iteration(rl8_iteration(algo, tracker), tracker.mean()) and not args.quick:
            break
    algo.close()
    result = progress.result(tracker.mean())
    emit(
        result.pop("env_steps"),
        result.pop("seconds"),
        **result,
        seed=args.seed,
        num_envs=w["num_envs"],
        rl8=rl8.__version__,
        rl8_file=rl8.__file__,
        device=args.device,
    )


def main() -> None:
    """Time collect + update of one workload and print the JSON line of ``emit``."""
    if WORKLOADS.get(sys.argv[1] if len(sys.argv) > 1 else "", {}).get("kind") == "mjlab":
        return mjlab_main(parse_side_args(settings=MJLAB_SETTINGS))
    args = parse_side_args(settings=SETTINGS)
    import rl8
    from rl8 import PPO

    if args.setting.startswith("compile") and not has_compile():
        raise SystemExit("this rl8 has no compile hyper-parameter")
    w = WORKLOADS[args.workload]
    if w["kind"] == "batched":
        from rl8.envs import Pendulum as env
    else:
        env = w["env"]
    algo = PPO(env, **hparams(args.workload, args.setting, args.device))
    warmup, iters = iterations(w, args.quick)
    for _ in range(warmup):
        algo.collect()
        algo.update()
    synchronize(args.device)
    start = time.perf_counter()
    for _ in range(iters):
        algo.collect()
        algo.update()
    synchronize(args.device)
    seconds = time.perf_counter() - start
    algo.close()
    emit(iters * batch_size(w), seconds, rl8=rl8.__version__, rl8_file=rl8.__file__, device=args.device)


if __name__ == "__main__":
    main()
