"""ManiSkill3's PushCube-v1 trained by rl8 and by rsl_rl 5.5.1, side by side, on ManiSkill's CPU physics.

Both sides train the same env, ``gym.make("PushCube-v1", num_envs=1, obs_mode="state",
sim_backend="physx_cpu")`` behind ManiSkill's ``ManiSkillVectorEnv`` (ManiSkill's CPU physics
simulates one env per process; many envs in one process need its GPU physics), with the same
hyper-parameters: the rsl_rl runner config :data:`TRAIN_CFG` (ManiSkill's own PPO baseline's
values where they carry over: gamma 0.8, lambda 0.9, a 256x3 tanh MLP), which rl8 reads with
``rl8.presets.from_rsl_rl``. rl8: ``PPO(make_maniskill_env(...))`` (``rl8.envs.maniskill``:
time-outs bootstrap from the true final observation). rsl_rl: its ``OnPolicyRunner`` over the
same env through :class:`RslRlManiSkill`, a minimal ``VecEnv`` wrapper (ManiSkill ships none;
time-outs bootstrap from the observation before the step, rsl_rl's way).

ManiSkill renders with Vulkan even for state observations: without a GPU, Mesa's software
device (lavapipe) 24.3 or newer is needed (Debian 12: ``mesa-vulkan-drivers`` from
bookworm-backports; docs/simulators.md).

Usage (from the repository root; the venv, made on first use under ``$RL8_PEERS_VENVS`` or
``/tmp/rl8-peers``, takes about 5 minutes)::

    python benchmarks/sims/maniskill.py                      # 3 seeds x 2 sides, 20,000 env steps each (about 25 minutes)
    python benchmarks/sims/maniskill.py --env-steps 4000 --seeds 1   # a try
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import common  # noqa: E402
from common import RL8_DEPS, Venv, emit, side_args, train_rl8, train_rsl_rl  # noqa: E402

TASK = "PushCube-v1"
VENV = Venv("maniskill", ("mani-skill==3.0.1", "rsl-rl-lib==5.5.1", *RL8_DEPS), "mani_skill")
#: rsl_rl 5's runner config of both sides.
TRAIN_CFG = {
    "algorithm": {
        "class_name": "PPO",
        "clip_param": 0.2,
        "desired_kl": None,
        "entropy_coef": 0.0,
        "gamma": 0.8,
        "lam": 0.9,
        "learning_rate": 3e-4,
        "max_grad_norm": 0.5,
        "num_learning_epochs": 4,
        "num_mini_batches": 4,
        "schedule": "fixed",
        "use_clipped_value_loss": False,
        "value_loss_coef": 0.5,
    },
    "actor": {
        "class_name": "MLPModel",
        "hidden_dims": [256, 256, 256],
        "activation": "tanh",
        "distribution_cfg": {
            "class_name": "GaussianDistribution",
            "init_std": 0.6,
            "std_type": "scalar",
        },
    },
    "critic": {"class_name": "MLPModel", "hidden_dims": [256, 256, 256], "activation": "tanh"},
    "obs_groups": {},  # both read the group "policy" (rsl_rl's default), the flat state
    "num_steps_per_env": 200,
    "save_interval": 10**9,
    "logger": "tensorboard",
}


class RslRlManiSkill:
    """rsl_rl's ``VecEnv`` interface over a ``ManiSkillVectorEnv`` (auto-reset): observations as
    the group ``"policy"``, ``dones = terminated | truncated``, ``extras["time_outs"] = truncated``.

    Args:
        vector_env: The ManiSkill vector env.
    """

    def __init__(self, vector_env) -> None:
        from tensordict import TensorDict

        self.vector_env, self.TensorDict = vector_env, TensorDict
        self.num_envs, self.device = vector_env.num_envs, vector_env.device
        self.num_actions = vector_env.single_action_space.shape[0]
        self.max_episode_length = 50
        self.cfg: dict = {}
        obs, _ = vector_env.reset(seed=0)
        self.obs = self._group(obs)

    @property
    def episode_length_buf(self):
        return self.vector_env.base_env.elapsed_steps

    def _group(self, obs):
        return self.TensorDict({"policy": obs}, batch_size=[self.num_envs])

    def get_observations(self):
        return self.obs

    def step(self, actions):
        obs, rewards, terminated, truncated, _ = self.vector_env.step(actions)
        self.obs = self._group(obs)
        return self.obs, rewards, terminated | truncated, {"time_outs": truncated}


def side_main(argv: list[str]) -> None:
    """One side's run (in the venv): train, print its JSON line."""
    args = side_args(argv)
    import gymnasium as gym
    import torch
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    torch.manual_seed(args.seed)
    if args.side == "rl8":
        from rl8.envs.maniskill import make_maniskill_env
        from rl8.presets import from_rsl_rl

        env = make_maniskill_env(TASK, args.num_envs, device="cpu")
        env.reset(seed=args.seed)
        result = train_rl8(env, {**from_rsl_rl(TRAIN_CFG).hparams, "seed": args.seed}, args.env_steps)
        result["success"] = result.pop("env_log").get("success")
    else:
        import mani_skill.envs  # noqa: F401  (registers the tasks)

        env = gym.make(
            TASK, num_envs=args.num_envs, obs_mode="state", sim_backend="physx_cpu", render_backend="cpu"
        )
        vec_env = RslRlManiSkill(ManiSkillVectorEnv(env, auto_reset=True))
        result = train_rsl_rl(vec_env, {**TRAIN_CFG, "seed": args.seed}, args.env_steps, False)
    emit(result, side=args.side, seed=args.seed, num_envs=args.num_envs, task=TASK)


def main(argv: list[str] | None = None) -> int:
    """One side's run with ``--side``, else both sides, alternating (``common.main``)."""
    return common.main(
        Path(__file__).resolve(),
        side_main,
        VENV,
        "mani-skill",
        argv,
        lambda a: f"ManiSkill3 {TASK}, {a.num_envs} env (state observations, CPU physics)",
        {"env_steps": 20_000, "num_envs": 1, "seeds": 3},
    )


if __name__ == "__main__":
    sys.exit(main())
