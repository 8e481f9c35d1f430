"""The workloads of the peers benchmark, one definition that every side reads (stdlib only).

Every side of a workload gets the same sizes and hyper-parameters from here; ``run.py`` passes
the workload's name to each side's script, which looks it up in :data:`WORKLOADS`.

Two kinds:

* ``batched``: rsl_rl's workload. A batched torch Pendulum (``rl8.envs.Pendulum``, simulated
  in torch for all envs at once), actor and critic 128x128x128 ELU, 5 epochs of 4
  minibatches, lr 1e-3, gamma 0.99, lambda 0.95, clip 0.2, value loss coefficient 1.0,
  entropy coefficient 0, gradient norm clipped to 1.0 (rsl_rl's defaults where the issue sets
  nothing), no observation normalisation, value loss clipping on (rsl_rl's default
  ``use_clipped_value_loss=True``; rl8 ``vf_clip_param=0.2``).
* ``gym``: SB3's default network (separate actor and critic, 64x64 tanh, orthogonal init),
  gymnasium envs in one process (a sync vector env; SB3's ``DummyVecEnv``), Adam lr 3e-4
  (eps 1e-5), gamma 0.99, lambda 0.95, clip 0.2, no value clipping, value coefficient 0.5,
  entropy 0, gradient norm 0.5, advantages normalised per minibatch, no observation or
  reward normalisation.
"""

from __future__ import annotations

import argparse
import json
import os

#: name -> the workload. ``num_envs`` envs x ``horizon`` steps per iteration; ``epochs``
#: passes over the batch in ``minibatches`` minibatches; ``warmup``/``iters`` (and the
#: ``quick_`` ones for ``--quick``): untimed and timed iterations in each measurement.
WORKLOADS: dict[str, dict] = {
    "pendulum-1024": dict(
        kind="batched",
        env="rl8.envs.Pendulum",
        num_envs=1024,
        horizon=24,
        hiddens=(128, 128, 128),
        activation="elu",
        epochs=5,
        minibatches=4,
        lr=1e-3,
        gamma=0.99,
        gae_lambda=0.95,
        clip=0.2,
        vf_coeff=1.0,
        max_grad_norm=1.0,
        warmup=1,
        iters=5,
        quick_warmup=1,
        quick_iters=2,
    ),
    "pendulum-4096": dict(
        kind="batched",
        env="rl8.envs.Pendulum",
        num_envs=4096,
        horizon=24,
        hiddens=(128, 128, 128),
        activation="elu",
        epochs=5,
        minibatches=4,
        lr=1e-3,
        gamma=0.99,
        gae_lambda=0.95,
        clip=0.2,
        vf_coeff=1.0,
        max_grad_norm=1.0,
        warmup=1,
        iters=2,
        quick_warmup=1,
        quick_iters=1,
    ),
    "CartPole-v1": dict(
        kind="gym",
        env="CartPole-v1",
        num_envs=8,
        horizon=128,
        hiddens=(64, 64),
        activation="tanh",
        epochs=4,
        minibatches=4,
        lr=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip=0.2,
        vf_coeff=0.5,
        max_grad_norm=0.5,
        warmup=2,
        iters=6,
        quick_warmup=1,
        quick_iters=2,
    ),
    "HalfCheetah-v5": dict(
        kind="gym",
        env="HalfCheetah-v5",
        num_envs=8,
        horizon=256,
        hiddens=(64, 64),
        activation="tanh",
        epochs=10,
        minibatches=32,
        lr=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip=0.2,
        vf_coeff=0.5,
        max_grad_norm=0.5,
        warmup=1,
        iters=2,
        quick_warmup=1,
        quick_iters=1,
    ),
    # mjlab's cartpole on warp's CPU device (mjlab_workload.py): the sizes and hyper-parameters
    # are the ones mjlab ships for the task (its registry's rsl_rl runner config), on both sides;
    # each round trains one seed until the return reaches ``target`` or ``max_env_steps`` pass.
    "mjlab-cartpole": dict(
        kind="mjlab",
        task="Mjlab-Cartpole-Balance",
        num_envs=256,
        target=45.0,
        max_env_steps=2_000_000,
        warmup=2,
        iters=0,
        quick_warmup=1,
        quick_iters=4,
        timeout=1800,
    ),
}


#: The batched workloads' extension settings, the same on rl8's and rsl_rl's side: rsl_rl 5's
#: ``symmetry_cfg`` (the pendulum's mirror theta -> -theta: both data augmentation and the mirror
#: loss) and ``rnd_cfg`` (its weight per second of simulated time: rsl_rl multiplies it by
#: ``step_dt``, rl8 is given the product). Each is an rl8 hparam (``symmetry``, ``rnd``) of
#: the same keys.
EXTENSIONS: dict[str, dict] = {
    "symmetry": dict(use_data_augmentation=True, use_mirror_loss=True, mirror_loss_coeff=1.0),
    "rnd": dict(
        weight=1.0,
        reward_normalization=True,
        state_normalization=True,
        learning_rate=1e-3,
        num_outputs=16,
        predictor_hidden_dims=[-1],
        target_hidden_dims=[-1],
    ),
}
#: Seconds per step of ``rl8.envs.Pendulum`` (its ``dt``), rsl_rl's ``env.unwrapped.step_dt``.
PENDULUM_STEP_DT = 0.05


def iterations(workload: dict, quick: bool) -> tuple[int, int]:
    """``(warm-up, timed)`` iterations of a workload's measurement (fewer with ``quick``)."""
    if quick:
        return workload["quick_warmup"], workload["quick_iters"]
    return workload["warmup"], workload["iters"]


def batch_size(workload: dict) -> int:
    """Env steps (transitions) per iteration: ``num_envs * horizon``."""
    return workload["num_envs"] * workload["horizon"]


def minibatch_size(workload: dict) -> int:
    """Transitions per minibatch: the batch split into ``minibatches`` equal parts."""
    return batch_size(workload) // workload["minibatches"]


# ------------------------------------------------------------------ the sides' common protocol
# Each side is a script run as ``python SIDE.py WORKLOAD [--quick] [--threads N] [--setting S]``
# in a fresh process; its last line of output is one JSON object (see :func:`emit`).


def parse_side_args(
    argv: list[str] | None = None, settings: tuple[str, ...] = ("fp32",)
) -> argparse.Namespace:
    """The command line of a side's script: the workload's name, ``--quick``, ``--threads``
    (torch threads, set before anything is built), ``--setting`` (one of ``settings``,
    e.g. ``fp32``/``bf16``) and ``--device`` (torch device of the env and the networks:
    ``cpu``, ``cuda``...). ``--num-envs``, ``--warmup`` and ``--iters`` replace the workload's
    own values in this process's :data:`WORKLOADS` (the GPU check, ``benchmarks/gpu``, runs
    ``pendulum-4096`` at 16,384 envs and more iterations this way)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--setting", choices=settings, default=settings[0])
    parser.add_argument(
        "--device", default="cpu", help="torch device of the env and the networks (default cpu)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the run (the mjlab workloads; default 0)"
    )
    for name, what in (
        ("num-envs", "envs"),
        ("warmup", "untimed iterations"),
        ("iters", "timed iterations"),
    ):
        parser.add_argument(f"--{name}", type=int, help=f"{what} instead of the workload's own (>= 1)")
    args = parser.parse_args(argv)
    changes = {"num_envs": args.num_envs, "warmup": args.warmup, "iters": args.iters}
    for key, value in changes.items():
        if value is not None and value < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {value}")
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes:
        # the quick counts too, so that --quick cannot undo --warmup/--iters
        changes.update({f"quick_{k}": v for k, v in changes.items() if k != "num_envs"})
        WORKLOADS[args.workload] = {**WORKLOADS[args.workload], **changes}
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    return args


def synchronize(device: str) -> None:
    """Wait for the work queued on ``device`` (a CUDA device runs asynchronously), so that a
    timer read next counts it; nothing on the CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def emit(env_steps: int, seconds: float, **extra: object) -> None:
    """Print the measurement as one JSON line: ``env_steps`` collected and trained on in
    ``seconds`` of wall time (warm-up left out), env steps per second, the torch threads in
    use and ``extra`` (versions, settings)."""
    import torch

    print(
        json.dumps(
            {
                "env_steps": env_steps,
                "seconds": seconds,
                "steps_per_s": env_steps / seconds,
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                **extra,
            }
        ),
        flush=True,
    )
