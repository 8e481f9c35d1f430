"""The training stats (``docs/trainer.md``, Metrics), reduced over ranks in one host transfer;
rl8 1.0.0's names of renamed stats answer with a ``DeprecationWarning``."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from rl8.ppo.losses import MONITORS, PPOLoss

if TYPE_CHECKING:
    from rl8.ppo.distributed import DistContext

__all__ = [
    "RENAMED_STATS",
    "Stats",
    "current_stat_name",
    "env_log_stat_name",
    "episode_means",
    "reduce_stats",
    "rollout_stats",
    "update_stats",
    "warn_renamed",
]

#: 1.0.0 name -> current name, for stats that were renamed (each also under ``eval/``).
RENAMED_STATS: dict[str, str] = {
    f"returns/{stat}": f"rollout/reward_sum_{stat}" for stat in ("min", "max", "mean", "std")
}

_EVAL_PREFIX = "eval/"

_MLFLOW_REFUSED = re.compile(r"[^A-Za-z0-9_.\- /]")  # MLflow's metric names, on every OS
_MLFLOW_MAX_NAME = 250


def env_log_stat_name(key: str) -> str:
    """The stat name of a value a simulator logs as ``key`` (:meth:`rl8.Env.pop_log`):
    ``env/<key>`` for a key with a ``/`` (``env/Episode_Reward/track_lin_vel_xy_exp``),
    ``env/Episode/<key>`` for one without (Genesis' ``rew_tracking_lin_vel``, as rsl_rl's
    ``Episode/``; so no name is one of the Trainer's ``env/steps``, ``env/resets``), made a
    valid MLflow metric name: each character but letters, digits, ``_ - . /`` and spaces
    becomes ``_``, empty, ``.`` and ``..`` path parts become ``_``, and the name is cut at 250
    characters."""
    parts = [_MLFLOW_REFUSED.sub("_", part) for part in key.split("/")]
    parts = ["_" if part in ("", ".", "..") else part for part in parts]
    name = "env/" + ("/".join(parts) if len(parts) > 1 else f"Episode/{parts[0]}")
    return name[:_MLFLOW_MAX_NAME].rstrip("/")


def current_stat_name(key: str) -> str | None:
    """The current name of a stat that rl8 1.0.0 called ``key`` (``"eval/returns/mean"``:
    ``"eval/rollout/reward_sum_mean"``), or ``None`` when ``key`` was not renamed."""
    if not isinstance(key, str):
        return None
    prefix = _EVAL_PREFIX if key.startswith(_EVAL_PREFIX) else ""
    new = RENAMED_STATS.get(key[len(prefix) :])
    return None if new is None else prefix + new


def warn_renamed(key: str, new: str, *, stacklevel: int = 2) -> None:
    """The ``DeprecationWarning`` for a 1.0.0 stat name ``key`` used where ``new`` is meant."""
    episodes = (_EVAL_PREFIX if key.startswith(_EVAL_PREFIX) else "") + "episodes/return_mean"
    warnings.warn(
        f"stat {key!r} is now called {new!r} (the sum of each env's rewards over the rollout, "
        f"not an episode return: that is {episodes!r}); the old name will be removed",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class Stats(dict[str, float]):
    """A ``{stat name: number}`` dict in which the names of :data:`RENAMED_STATS` still answer
    lookups (``[]``, ``get``, ``in``) with a ``DeprecationWarning``; iteration sees the current
    names only."""

    def _alias(self, key: object) -> str | None:
        new = current_stat_name(key)
        if new is None or not dict.__contains__(self, new):
            return None
        warn_renamed(key, new, stacklevel=3)  # type: ignore[arg-type]
        return new

    def __missing__(self, key: str) -> float:
        new = self._alias(key)
        if new is None:
            raise KeyError(key)
        return dict.__getitem__(self, new)

    def get(self, key: str, default: float | None = None) -> float | None:  # type: ignore[override]
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        new = self._alias(key)
        return default if new is None else dict.__getitem__(self, new)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._alias(key) is not None


def reduce_stats(
    dist: DistContext,
    *,
    sums: Mapping[str, torch.Tensor] | None = None,
    means: Mapping[str, torch.Tensor] | None = None,
    mins: Mapping[str, torch.Tensor] | None = None,
    maxs: Mapping[str, torch.Tensor] | None = None,
    local: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """``{name: 0-d tensor}`` statistics as ``{name: float}`` (float64), reduced across the ranks
    of ``dist`` (:class:`~rl8.ppo.distributed.DistContext`) and read back with ONE host transfer:
    ``sums`` summed, ``means`` averaged, ``mins``/``maxs`` the ranks' smallest/largest, ``local``
    this rank's own; each name in one group only."""
    sums, means, mins, maxs, local = (dict(values or {}) for values in (sums, means, mins, maxs, local))
    names = [*sums, *means, *mins, *maxs, *local]
    if len(set(names)) != len(names):
        raise ValueError(f"reduce_stats: expected each stat name once, got {names}")
    parts = []
    if sums or means:
        summed = dist.all_reduce_(_stack([*sums.values(), *means.values()]))
        summed[len(sums) :] /= dist.world_size
        parts.append(summed)
    for values, op in ((mins, "min"), (maxs, "max")):
        if values:
            parts.append(dist.all_reduce_(_stack(values.values()), op))
    if local:
        parts.append(_stack(local.values()))
    return dict(zip(names, torch.cat(parts).tolist())) if parts else {}


def rollout_stats(
    dist: DistContext,
    rewards: torch.Tensor,
    episode_sums: Mapping[str, torch.Tensor] | None = None,
    sums: Mapping[str, torch.Tensor] | None = None,
    local: Mapping[str, torch.Tensor] | None = None,
    env_episode_sums: Mapping[str, torch.Tensor] | None = None,
    env_log: Mapping[str, torch.Tensor] | None = None,
) -> tuple[Stats, dict[str, float]]:
    """Rollout stats of ``rewards`` (all ranks), read back in ONE transfer; returns the
    :class:`Stats` and every reduced value by name (``sums`` and ``local`` included).

    Args:
        dist: The run's :class:`~rl8.ppo.distributed.DistContext`.
        rewards: ``[num_envs, T]`` rewards of the rollout.
        episode_sums: ``episodes/{return_sum,length_sum,count}`` of the episodes that ended;
            ``None`` for envs without episodes.
        sums: More 0-d tensors to sum over ranks and read back.
        local: More 0-d tensors to read back as they are on this rank.
        env_episode_sums: ``env_episodes/{...}`` sums of the episodes the env recorded itself.
        env_log: The simulator's per-episode means by its names (:meth:`rl8.Env.pop_log`),
            reported as this rank's under :func:`env_log_stat_name` (``env/...``): ranks may log
            different names, so they are not reduced (rank 0's are tracked, as rsl_rl does).
    """
    f64 = torch.float64
    reward_sums = rewards.sum(1, dtype=f64)  # per env, over the rollout's steps
    totals = {  # (the sum of all rewards is the sum of the reward sums)
        "reward_sum": reward_sums.sum(),
        "reward_sum_sq": reward_sums.dot(reward_sums),
        "reward_sq": torch.linalg.vector_norm(rewards, dtype=f64).square(),
        **(episode_sums or {}),
        **(env_episode_sums or {}),
        **(sums or {}),
    }
    env_stats = {env_log_stat_name(key): value for key, value in (env_log or {}).items()}
    ret_lo, ret_hi = reward_sums.aminmax()
    rew_lo, rew_hi = rewards.aminmax()
    values = reduce_stats(
        dist,
        sums=totals,
        local={**(local or {}), **env_stats},
        mins={"rollout/reward_sum_min": ret_lo, "rewards/min": rew_lo},
        maxs={"rollout/reward_sum_max": ret_hi, "rewards/max": rew_hi},
    )
    world = dist.world_size
    out = Stats()
    for prefix, n, sum_sq in (
        ("rollout/reward_sum_", reward_sums.numel() * world, values["reward_sum_sq"]),
        ("rewards/", rewards.numel() * world, values["reward_sq"]),
    ):
        mean = values["reward_sum"] / n
        out[f"{prefix}min"] = values[f"{prefix}min"]
        out[f"{prefix}max"] = values[f"{prefix}max"]
        out[f"{prefix}mean"] = mean
        out[f"{prefix}std"] = max(sum_sq / n - mean * mean, 0.0) ** 0.5
    for prefix, given in (("episodes/", episode_sums), ("env_episodes/", env_episode_sums)):
        if given is not None:
            out.update(
                episode_means(
                    prefix,
                    values[f"{prefix}return_sum"],
                    values[f"{prefix}length_sum"],
                    values[f"{prefix}count"],
                )
            )
    out.update({name: values[name] for name in env_stats})
    return out, values


def intrinsic_moments(intrinsic: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sums of hparam rnd's intrinsic rewards ``[num_envs, T]`` and of their squares (0-d),
    for :func:`rollout_stats`' ``sums``."""
    f64 = torch.float64
    return {
        "intrinsic_sum": intrinsic.sum(dtype=f64),
        "intrinsic_sq": torch.linalg.vector_norm(intrinsic, dtype=f64).square(),
    }


def intrinsic_stats(values: Mapping[str, float], count: int) -> dict[str, float]:
    """``rewards/intrinsic_mean`` and ``rewards/intrinsic_std`` of ``count`` intrinsic rewards
    (every rank's) from the reduced :func:`intrinsic_moments`."""
    mean = values["intrinsic_sum"] / count
    return {
        "rewards/intrinsic_mean": mean,
        "rewards/intrinsic_std": max(values["intrinsic_sq"] / count - mean * mean, 0.0) ** 0.5,
    }


def episode_means(prefix: str, return_sum: float, length_sum: float, count: float) -> dict[str, float]:
    """``{prefix}return_mean``, ``{prefix}length_mean`` and ``{prefix}count`` of ``count``
    episodes from their summed returns and lengths (NaN means when none ended)."""
    nan = float("nan")
    return {
        f"{prefix}return_mean": return_sum / count if count > 0 else nan,
        f"{prefix}length_mean": length_sum / count if count > 0 else nan,
        f"{prefix}count": count,
    }


def _stack(tensors) -> torch.Tensor:
    """0-d tensors of any dtypes as one float64 vector."""
    return torch.stack(list(tensors)).double()


def update_stats(
    dist: DistContext,
    losses: list[PPOLoss],
    grad_norms: list[torch.Tensor],
    explained_variance: torch.Tensor,
    vf_coeff: float,
    entropy_coeff: float,
    lr: float,
    extra_losses: Mapping[str, tuple[list[torch.Tensor], float]] | None = None,
) -> dict[str, float]:
    """The stats of :meth:`rl8.PPO.update`, reduced over ranks in one host transfer; ``vf_coeff``,
    ``entropy_coeff`` and ``lr`` are the update's (reported under ``coefficients/``).

    Args:
        dist: The run's :class:`~rl8.ppo.distributed.DistContext`.
        losses: Each minibatch's :class:`~rl8.ppo.losses.PPOLoss` (the stats are means).
        grad_norms: Each optimizer step's gradient norm before clipping, 0-d tensors.
        explained_variance: ``1 - Var(returns - values) / Var(returns)`` of the collect, 0-d.
        extra_losses: The extensions' losses (``symmetry``, ``rnd``): ``{name: (each
            minibatch's 0-d loss, its weight in the total)}``, reported as ``losses/{name}`` means.
    """
    extra = dict(extra_losses or {})
    means = {name: torch.stack([getattr(loss, name) for loss in losses]).mean() for name in MONITORS}
    means["explained_variance"] = explained_variance
    means["grad_norm"] = torch.stack(grad_norms).mean()
    means.update({f"extra_{name}": torch.stack(values).mean() for name, (values, _) in extra.items()})
    out = reduce_stats(dist, means=means)
    policy_loss, vf_loss, entropy = out["policy_loss"], out["value_loss"], out["entropy"]
    extra_total = sum(weight * out[f"extra_{name}"] for name, (_, weight) in extra.items())
    return {
        "losses/policy": policy_loss,
        "losses/vf": vf_loss,
        "losses/entropy": -entropy,
        # the mean of the minibatches' total losses, from the means of their (linear) terms
        "losses/total": policy_loss + vf_coeff * vf_loss - entropy_coeff * entropy + extra_total,
        **{f"losses/{name}": out[f"extra_{name}"] for name in extra},
        "monitors/kl_div": out["approx_kl"],
        "monitors/clip_fraction": out["clip_fraction"],
        "monitors/explained_variance": out["explained_variance"],
        "monitors/grad_norm": out["grad_norm"],
        "coefficients/entropy": entropy_coeff,
        "coefficients/vf": vf_coeff,
        "coefficients/lr": lr,
    }
