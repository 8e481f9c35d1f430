"""NaN/inf checks of training: the env's data in the rollout buffer and the reduced stats."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from rl8.envs.base import EnvOutputError, find_nonfinite
from rl8.ppo.buffer import RolloutBuffer

__all__ = [
    "CHECKED_ROLLOUT_STATS",
    "CHECKED_UPDATE_STATS",
    "NonFiniteError",
    "check_buffer_finite",
    "check_stats_finite",
]

#: Update stats checked for NaN/inf after every update (the grad norm only without a gradient
#: scaler: with one, an inf grad norm is a skipped step).
CHECKED_UPDATE_STATS = ("losses/total", "monitors/grad_norm")
#: Rollout stats checked for NaN/inf after every collect (they reduce every reward).
CHECKED_ROLLOUT_STATS = (
    "rollout/reward_sum_mean",
    "rollout/reward_sum_std",
    "rewards/min",
    "rewards/max",
)


class NonFiniteError(FloatingPointError):
    """Training produced NaN or inf (a loss, the gradient norm or a rollout statistic); the
    parameters may be non-finite already, so the Trainer never checkpoints them."""


def check_buffer_finite(buffer: RolloutBuffer, env_name: str, collect: int) -> None:
    """Raise an :class:`~rl8.envs.base.EnvOutputError` naming the envs and steps where the
    observations or rewards of ``buffer`` hold NaN or inf (the message names the env
    ``env_name`` and the number ``collect`` of the collect, 1 for the first)."""
    for key in ("obs", "rewards"):
        bad = find_nonfinite(buffer[key][:, : buffer.horizon + (key == "obs")], batch_dims=2)
        if bad is not None:
            pairs = ", ".join(f"(env {i}, step {t})" for i, t in bad[:10].tolist())
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise EnvOutputError(
                f"{env_name}: non-finite values (NaN or inf) in {key!r} at {pairs}{more} during "
                f"collect {collect} (set check_finite_collects=0 to turn this check off)"
            )


def check_stats_finite(
    stats: Mapping[str, float],
    names: tuple[str, ...],
    where: str,
    env_steps: int,
    find_cause: Callable[[], None] | None = None,
) -> None:
    """Raise a :class:`NonFiniteError` when one of the ``stats`` named ``names`` is NaN or inf.

    Args:
        stats: ``{name: value}``.
        names: The names to check (names not in ``stats`` are skipped).
        where: Where in training, for the message (``"collect 3"``, ``"update step 4"``).
        env_steps: Env steps so far, for the message.
        find_cause: Called first when a stat is bad; it may raise a more precise error.
    """
    bad = [name for name in names if name in stats and not math.isfinite(stats[name])]
    if not bad:
        return
    if find_cause is not None:
        find_cause()
    values = ", ".join(f"{name}={stats[name]}" for name in bad)
    raise NonFiniteError(
        f"non-finite {values} at {where} (env steps {env_steps}); training cannot "
        "go on from here: resume from the last checkpoint (e.g. with a lower lr or "
        "max_grad_norm) or find what makes the model or env produce NaN/inf"
    )
