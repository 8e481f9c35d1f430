"""Raw-torch floors for the throughput benchmarks.

A floor is the least work any PPO implementation must do for a workload, written in plain
torch with no env, no buffer and no bookkeeping:

* collect floor: the same policy and value MLPs' forward pass plus sampling an action, for
  ``horizon`` steps of ``num_envs`` observations;
* update floor: the same number of forward + backward + Adam passes over minibatches of the
  same size, with a minimal PPO-like loss (log-prob times advantage plus a squared value
  error).

rl8's figures are reported as a fraction of these floors measured in the same run.
"""

from __future__ import annotations

import torch
from torch import nn


def make_mlps(
    obs_dim: int, num_actions: int, hidden: int, activation: type[nn.Module]
) -> tuple[nn.Module, nn.Module]:
    """Separate policy and value MLPs with two hidden layers of width ``hidden``."""

    def mlp(out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(obs_dim, hidden),
            activation(),
            nn.Linear(hidden, hidden),
            activation(),
            nn.Linear(hidden, out),
        )

    return mlp(num_actions), mlp(1)


@torch.no_grad()
def collect_floor(
    pi: nn.Module, vf: nn.Module, obs: torch.Tensor, horizon: int, amp: bool = False
) -> torch.Tensor:
    """Forward both MLPs and sample a categorical action (inverse CDF) ``horizon`` times."""
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)
    actions = None
    with ctx:
        for _ in range(horizon):
            logits = pi(obs)
            vf(obs)
            cdf = logits.float().softmax(-1).cumsum(-1)
            u = torch.rand(cdf.shape[0], 1)
            actions = (cdf < u).sum(-1)
    return actions


def update_floor(
    pi: nn.Module,
    vf: nn.Module,
    optimizer: torch.optim.Optimizer,
    obs: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    num_passes: int,
    minibatch_size: int,
    amp: bool = False,
) -> None:
    """``num_passes`` passes of forward + backward + optimizer step over ``obs`` in minibatches."""
    n = obs.shape[0]
    for _ in range(num_passes):
        for start in range(0, n, minibatch_size):
            sl = slice(start, start + minibatch_size) if minibatch_size < n else slice(None)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = pi(obs[sl])
                values = vf(obs[sl])
            logp = logits.float().log_softmax(-1).gather(-1, actions[sl, None])[:, 0]
            loss = -(logp * advantages[sl]).mean() + (values.float()[:, 0] - returns[sl]).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
