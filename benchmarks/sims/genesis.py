"""Genesis' Unitree Go2 learning to walk, trained by rl8 and by rsl_rl 5.5.1, side by side, on Genesis' CPU backend.

Both sides train the same env, :class:`support/go2.py <go2.Go2Walk>` (written for this benchmark from Genesis'
documented API, in the shape of Genesis' locomotion example: rsl_rl's ``VecEnv`` interface),
on ``gs.init(backend=gs.cpu)``, with the same hyper-parameters: the rsl_rl runner config that
Genesis' locomotion example documents (:data:`TRAIN_CFG`), which rl8 reads with
``rl8.presets.from_rsl_rl``. rsl_rl: ``OnPolicyRunner(env, TRAIN_CFG).learn(...,
init_at_random_ep_len=True)``, as Genesis' example trains. rl8: ``PPO(RslRlEnv(env,
init_at_random_ep_len=True), **hparams)`` (``rl8.envs.rsl_rl``; time-outs bootstrap from the
observation before the step, as in rsl_rl). Episodes are 5 simulated seconds (250 steps)
instead of the example's 20, so that a short budget sees many of them.

Genesis compiles its kernels on the first build of a scene (about 9 minutes on 2 busy cores,
cached under ``~/.cache`` afterwards; each later run builds in 1-2 minutes, not timed).

Usage (from the repository root; the venv, made on first use under ``$RL8_PEERS_VENVS`` or
``/tmp/rl8-peers``, takes about 8 minutes)::

    python benchmarks/sims/genesis.py                       # 3 seeds x 2 sides, 4 envs, 19,200 env steps each (about 25 minutes)
    python benchmarks/sims/genesis.py --env-steps 2400 --seeds 1    # a try
"""

from __future__ import annotations

import sys
from pathlib import Path

# the helpers' folder instead of this one, whose genesis.py would shadow the genesis package
sys.path[0] = str(Path(__file__).resolve().parent / "support")

import common  # noqa: E402
from common import RL8_DEPS, Venv, emit, side_args, train_rl8, train_rsl_rl  # noqa: E402

VENV = Venv("genesis", ("genesis-world==1.4.5", "rsl-rl-lib==5.5.1", *RL8_DEPS), "genesis")
#: Simulated seconds per episode.
EPISODE_SECONDS = 5.0
#: rsl_rl 5's runner config of both sides: the values of Genesis' locomotion example.
TRAIN_CFG = {
    "algorithm": {
        "class_name": "PPO",
        "clip_param": 0.2,
        "desired_kl": 0.01,
        "entropy_coef": 0.01,
        "gamma": 0.99,
        "lam": 0.95,
        "learning_rate": 0.001,
        "max_grad_norm": 1.0,
        "num_learning_epochs": 5,
        "num_mini_batches": 4,
        "schedule": "adaptive",
        "use_clipped_value_loss": True,
        "value_loss_coef": 1.0,
    },
    "actor": {
        "class_name": "MLPModel",
        "hidden_dims": [512, 256, 128],
        "activation": "elu",
        "distribution_cfg": {
            "class_name": "GaussianDistribution",
            "init_std": 1.0,
            "std_type": "scalar",
        },
    },
    "critic": {"class_name": "MLPModel", "hidden_dims": [512, 256, 128], "activation": "elu"},
    "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
    "num_steps_per_env": 24,
    "save_interval": 10**9,
    "logger": "tensorboard",
}


def side_main(argv: list[str]) -> None:
    """One side's run (in the venv): build the env, train, print its JSON line."""
    args = side_args(argv)
    import genesis as gs
    import torch

    gs.init(backend=gs.cpu, precision="32", logging_level="warning", seed=args.seed)
    torch.manual_seed(args.seed)
    from go2 import Go2Walk

    env = Go2Walk(args.num_envs, episode_seconds=EPISODE_SECONDS)
    if args.side == "rl8":
        from rl8.envs.rsl_rl import RslRlEnv
        from rl8.presets import from_rsl_rl

        hparams = {**from_rsl_rl(TRAIN_CFG).hparams, "seed": args.seed}
        result = train_rl8(RslRlEnv(env, init_at_random_ep_len=True), hparams, args.env_steps)
        result.pop("env_log")
    else:
        result = train_rsl_rl(env, {**TRAIN_CFG, "seed": args.seed}, args.env_steps, True)
    emit(result, side=args.side, seed=args.seed, num_envs=args.num_envs, task="Go2Walk")


def main(argv: list[str] | None = None) -> int:
    """One side's run with ``--side``, else both sides, alternating (``common.main``)."""
    return common.main(
        Path(__file__).resolve(),
        side_main,
        VENV,
        "genesis-world",
        argv,
        lambda a: (
            f"Genesis Go2Walk (benchmarks/sims/support/go2.py), {a.num_envs} envs, {EPISODE_SECONDS:g} s episodes (CPU backend)"
        ),
        {"env_steps": 19_200, "num_envs": 4, "seeds": 3},
    )


if __name__ == "__main__":
    sys.exit(main())
