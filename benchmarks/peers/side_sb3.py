"""Stable-Baselines3's side of the peers benchmark: ``PPO("MlpPolicy")`` on a gym workload.

Runs in SB3's virtualenv. SB3's default policy (separate actor and critic, 64x64 tanh,
orthogonal init, Adam eps 1e-5) on ``make_vec_env`` (a ``DummyVecEnv`` of ``num_envs`` envs,
each with SB3's ``Monitor``), ``n_steps``, ``batch_size``, ``n_epochs`` and the other
hyper-parameters from the workload. Times ``model.learn`` over the timed iterations, after a
first ``learn`` for the warm-up ones.

    python benchmarks/peers/side_sb3.py CartPole-v1 --threads 2
"""

from __future__ import annotations

import importlib.metadata
import time

from workloads import WORKLOADS, batch_size, emit, iterations, minibatch_size, parse_side_args


def main() -> None:
    """Time ``model.learn`` on one gym workload and print the JSON line of ``emit``."""
    args = parse_side_args()
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from torch import nn

    w = WORKLOADS[args.workload]
    env = make_vec_env(w["env"], n_envs=w["num_envs"], seed=0)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=w["horizon"],
        batch_size=minibatch_size(w),
        n_epochs=w["epochs"],
        learning_rate=w["lr"],
        gamma=w["gamma"],
        gae_lambda=w["gae_lambda"],
        clip_range=w["clip"],
        ent_coef=0.0,
        vf_coef=w["vf_coeff"],
        max_grad_norm=w["max_grad_norm"],
        normalize_advantage=True,
        policy_kwargs={
            "net_arch": {"pi": list(w["hiddens"]), "vf": list(w["hiddens"])},
            "activation_fn": {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}[w["activation"]],
        },
        device="cpu",
        seed=0,
        verbose=0,
    )
    warmup, iters = iterations(w, args.quick)
    model.learn(warmup * batch_size(w))
    start = time.perf_counter()
    model.learn(iters * batch_size(w), reset_num_timesteps=False)
    seconds = time.perf_counter() - start
    steps = model.num_timesteps - warmup * batch_size(w)
    env.close()
    emit(
        steps,
        seconds,
        **{
            "stable-baselines3": importlib.metadata.version("stable-baselines3"),
            "gymnasium": importlib.metadata.version("gymnasium"),
        },
    )


if __name__ == "__main__":
    main()
