"""A plain PPO loop in the style of CleanRL's ``ppo.py``, for the peers benchmark.

Written for this benchmark (not CleanRL's code): one file, numpy gymnasium vector env, a
separate actor and critic (SB3's default sizes), GAE, the clipped surrogate, Adam, per
minibatch advantage normalisation, global gradient-norm clipping. ``done`` is ``terminated or
truncated`` and a truncated episode is not bootstrapped, as in CleanRL. Needs only torch,
numpy and gymnasium, so it runs in rl8's own environment.

Run as a side of ``run.py``::

    python benchmarks/peers/cleanrl_ppo.py CartPole-v1 --threads 2
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn
from workloads import WORKLOADS, batch_size, emit, iterations, minibatch_size, parse_side_args

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def layer(n_in: int, n_out: int, std: float) -> nn.Linear:
    """A linear layer with orthogonal weights of gain ``std`` and zero biases."""
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.zeros_(linear.bias)
    return linear


def mlp(
    n_in: int, hiddens: tuple[int, ...], n_out: int, activation: str, out_std: float
) -> nn.Sequential:
    """Hidden layers of widths ``hiddens`` with ``activation``, then a linear output."""
    layers: list[nn.Module] = []
    for width in hiddens:
        layers += [layer(n_in, width, np.sqrt(2)), ACTIVATIONS[activation]()]
        n_in = width
    return nn.Sequential(*layers, layer(n_in, n_out, out_std))


class Agent(nn.Module):
    """Separate actor and critic MLPs; a categorical policy for ``Discrete`` action spaces, a
    diagonal Gaussian with a state-independent log std for ``Box`` ones.

    Args:
        obs_dim: Size of the flat observation.
        action_space: The env's single action space (``Discrete`` or ``Box``).
        hiddens: Widths of the hidden layers of each network.
        activation: ``"tanh"``, ``"relu"`` or ``"elu"``.
    """

    def __init__(
        self, obs_dim: int, action_space: gymnasium.Space, hiddens: tuple[int, ...], activation: str
    ) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gymnasium.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.critic = mlp(obs_dim, hiddens, 1, activation, 1.0)
        self.actor = mlp(obs_dim, hiddens, n_out, activation, 0.01)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(n_out))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``[batch]`` state values."""
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution at ``obs`` (log-probs summed over action dimensions)."""
        out = self.actor(obs)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        normal = torch.distributions.Normal(out, self.log_std.exp().expand_as(out))
        return torch.distributions.Independent(normal, 1)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    last_done: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalised advantage estimates, ``[steps, envs]``.

    Args:
        rewards: ``[steps, envs]`` rewards of each step.
        values: ``[steps, envs]`` value estimates of the observation each step acted on.
        dones: ``[steps, envs]`` 1.0 where the observation each step acted on started a new
            episode (the previous step ended one), as in CleanRL.
        last_value: ``[envs]`` value of the observation after the last step.
        last_done: ``[envs]`` 1.0 where the last step ended an episode.
        gamma: Discount factor.
        lam: GAE's lambda.
    """
    steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(steps)):
        if t == steps - 1:
            next_nonterminal, next_value = 1.0 - last_done, last_value
        else:
            next_nonterminal, next_value = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_value * next_nonterminal - values[t]
        running = delta + gamma * lam * next_nonterminal * running
        advantages[t] = running
    return advantages


class PPOLoop:
    """CleanRL-style PPO on a gymnasium sync vector env: :meth:`collect` then :meth:`update`.

    Args:
        env_id: A gymnasium id (``"CartPole-v1"``).
        num_envs: Envs stepped together.
        num_steps: Steps per env per iteration.
        epochs: Passes over the batch per update.
        minibatches: Minibatches per pass.
        lr: Adam's learning rate.
        gamma: Discount factor.
        gae_lambda: GAE's lambda.
        clip: The ratio clip epsilon.
        vf_coeff: Weight of the value loss.
        max_grad_norm: Global gradient norm clip.
        hiddens: Hidden widths of the actor and of the critic.
        activation: Their activation.
        seed: Seed of torch, numpy and the envs.
    """

    def __init__(
        self,
        env_id: str,
        *,
        num_envs: int,
        num_steps: int,
        epochs: int,
        minibatches: int,
        lr: float,
        gamma: float,
        gae_lambda: float,
        clip: float,
        vf_coeff: float,
        max_grad_norm: float,
        hiddens: tuple[int, ...],
        activation: str,
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.envs = gymnasium.wrappers.vector.RecordEpisodeStatistics(
            gymnasium.vector.SyncVectorEnv(
                [lambda: gymnasium.make(env_id) for _ in range(num_envs)],
                autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
            )
        )
        space = self.envs.single_action_space
        self.low = getattr(space, "low", None)
        self.high = getattr(space, "high", None)
        obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.agent = Agent(obs_dim, space, hiddens, activation)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=lr, eps=1e-5)
        self.num_envs, self.num_steps = num_envs, num_steps
        self.epochs, self.minibatches = epochs, minibatches
        self.gamma, self.gae_lambda, self.clip = gamma, gae_lambda, clip
        self.vf_coeff, self.max_grad_norm = vf_coeff, max_grad_norm
        obs, _ = self.envs.reset(seed=seed)
        self.next_obs = torch.as_tensor(obs, dtype=torch.float32).reshape(num_envs, -1)
        self.next_done = torch.zeros(num_envs)
        self.batch: dict[str, torch.Tensor] = {}

    def collect(self) -> list[float]:
        """Step the envs ``num_steps`` times with the current policy, keep the batch (with its
        advantages and returns) for :meth:`update`; returns the finished episodes' returns."""
        n, s = self.num_envs, self.num_steps
        obs = torch.zeros(s, n, self.next_obs.shape[1])
        actions: list[torch.Tensor] = []
        logprobs, rewards, dones, values = (torch.zeros(s, n) for _ in range(4))
        returns: list[float] = []
        for t in range(s):
            obs[t], dones[t] = self.next_obs, self.next_done
            with torch.no_grad():
                dist = self.agent.dist(self.next_obs)
                action = dist.sample()
                logprobs[t] = dist.log_prob(action)
                values[t] = self.agent.value(self.next_obs)
            actions.append(action)
            env_action = action.numpy()
            if self.low is not None:
                env_action = np.clip(env_action, self.low, self.high)
            next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
            self.next_obs = torch.as_tensor(next_obs, dtype=torch.float32).reshape(n, -1)
            self.next_done = torch.as_tensor(np.logical_or(terminated, truncated), dtype=torch.float32)
            if "episode" in info:
                returns += info["episode"]["r"][info["_episode"]].tolist()
        with torch.no_grad():
            last_value = self.agent.value(self.next_obs)
        advantages = gae(rewards, values, dones, last_value, self.next_done, self.gamma, self.gae_lambda)
        self.batch = {
            "obs": obs.reshape(s * n, -1),
            "actions": torch.stack(actions).reshape(s * n, *actions[0].shape[1:]),
            "logprobs": logprobs.reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": (advantages + values).reshape(-1),
        }
        return returns

    def update(self) -> dict[str, float]:
        """``epochs`` passes of minibatch gradient steps on the collected batch; returns the
        last minibatch's losses and approximate KL divergence."""
        b = self.batch
        size = b["obs"].shape[0]
        mb_size = size // self.minibatches
        stats: dict[str, Any] = {}
        for _ in range(self.epochs):
            order = torch.as_tensor(self.rng.permutation(size))
            for start in range(0, size, mb_size):
                idx = order[start : start + mb_size]
                dist = self.agent.dist(b["obs"][idx])
                logprob = dist.log_prob(b["actions"][idx])
                log_ratio = logprob - b["logprobs"][idx]
                ratio = log_ratio.exp()
                adv = b["advantages"][idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(
                    -adv * ratio, -adv * ratio.clamp(1 - self.clip, 1 + self.clip)
                ).mean()
                v_loss = 0.5 * (self.agent.value(b["obs"][idx]) - b["returns"][idx]).pow(2).mean()
                loss = pg_loss + self.vf_coeff * v_loss
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), self.max_grad_norm)
                self.optimizer.step()
                with torch.no_grad():
                    stats = {
                        "policy_loss": pg_loss.item(),
                        "value_loss": v_loss.item(),
                        "approx_kl": ((ratio - 1) - log_ratio).mean().item(),
                    }
        return stats

    def close(self) -> None:
        """Close the envs."""
        self.envs.close()


def from_workload(name: str, seed: int = 0) -> PPOLoop:
    """The loop of a ``gym`` workload of :data:`workloads.WORKLOADS`."""
    w = WORKLOADS[name]
    return PPOLoop(
        w["env"],
        num_envs=w["num_envs"],
        num_steps=w["horizon"],
        epochs=w["epochs"],
        minibatches=w["minibatches"],
        lr=w["lr"],
        gamma=w["gamma"],
        gae_lambda=w["gae_lambda"],
        clip=w["clip"],
        vf_coeff=w["vf_coeff"],
        max_grad_norm=w["max_grad_norm"],
        hiddens=tuple(w["hiddens"]),
        activation=w["activation"],
        seed=seed,
    )


def main() -> None:
    """Time collect + update of one gym workload and print the JSON line of ``emit``."""
    args = parse_side_args()
    w = WORKLOADS[args.workload]
    assert minibatch_size(w) * w["minibatches"] == batch_size(w)
    loop = from_workload(args.workload)
    warmup, iters = iterations(w, args.quick)
    for _ in range(warmup):
        loop.collect()
        loop.update()
    start = time.perf_counter()
    for _ in range(iters):
        loop.collect()
        loop.update()
    seconds = time.perf_counter() - start
    loop.close()
    emit(iters * batch_size(w), seconds, gymnasium=gymnasium.__version__)


if __name__ == "__main__":
    main()
