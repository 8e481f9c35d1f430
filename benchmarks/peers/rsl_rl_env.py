"""rsl_rl's ``VecEnv`` interface around rl8's batched torch Pendulum (``rl8.envs.Pendulum``).

rsl_rl (``rsl-rl-lib``) trains on any object with its ``VecEnv`` attributes and methods: the
observations as a TensorDict of observation groups (here one group, ``"policy"``, that the
actor and the critic both read), ``step(actions)`` returning ``(obs, rewards [num_envs], dones
[num_envs], extras)``, with ``extras["time_outs"]`` marking the episodes cut by the time limit
(rsl_rl bootstraps their value, as rl8 does from ``final_obs``). This is what Isaac Lab's
wrapper gives rsl_rl. Needs rsl_rl and rl8 importable (``run.py`` puts the checkout on
``PYTHONPATH`` of rsl_rl's virtualenv).
"""

from __future__ import annotations

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict
from workloads import PENDULUM_STEP_DT

from rl8.envs import Pendulum


class RslPendulum(VecEnv):
    """``num_envs`` pendulums of ``rl8.envs.Pendulum`` behind rsl_rl's ``VecEnv`` interface.

    Args:
        num_envs: Pendulums simulated together.
        device: Torch device of the simulation.
        seed: Seed of the first reset.
    """

    def __init__(self, num_envs: int, device: str = "cpu", seed: int = 0) -> None:
        self.env = Pendulum(num_envs, device=device)
        self.num_envs = num_envs
        self.num_actions = int(self.env.action_space.shape[0])
        self.max_episode_length = int(self.env.params["max_episode_steps"])
        self.device = self.env.device
        self.cfg: dict = {}
        self._obs = self.env.reset(seed=seed)

    @property
    def unwrapped(self) -> RslPendulum:
        """The env itself (rsl_rl's RND reads ``env.unwrapped.step_dt``)."""
        return self

    @property
    def step_dt(self) -> float:
        """Seconds of simulated time per step."""
        return PENDULUM_STEP_DT

    @property
    def episode_length_buf(self) -> torch.Tensor:
        """``[num_envs]`` steps taken in each pendulum's current episode."""
        return self.env.steps[:, 0]

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:
        self.env.steps[:, 0] = value

    def get_observations(self) -> TensorDict:
        """The current observations: group ``"policy"``, ``[num_envs, 3]``."""
        return TensorDict({"policy": self._obs}, batch_size=[self.num_envs], device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """Apply ``[num_envs, 1]`` torques; returns the next observations, ``[num_envs]`` rewards,
        ``[num_envs]`` dones (int64, 1 where an episode ended; the pendulum resets itself) and
        ``{"time_outs": [num_envs] bool}``."""
        out = self.env.step(actions)
        self._obs = out["obs"]
        truncated = out["truncated"][:, 0]
        dones = (out["terminated"][:, 0] | truncated).long()
        return self.get_observations(), out["rewards"][:, 0], dones, {"time_outs": truncated}


def mirror_pendulum(
    env: object = None, obs: TensorDict | None = None, actions: torch.Tensor | None = None
) -> tuple[TensorDict | None, torch.Tensor | None]:
    """rsl_rl's ``data_augmentation_func`` for :class:`RslPendulum`: ``rl8.envs.Pendulum.mirror``
    on the ``"policy"`` group, the originals first."""
    if obs is not None:
        policy, _ = Pendulum.mirror(obs=obs["policy"])
        obs = TensorDict({"policy": policy}, batch_size=[policy.shape[0]], device=policy.device)
    if actions is not None:
        _, actions = Pendulum.mirror(actions=actions)
    return obs, actions
