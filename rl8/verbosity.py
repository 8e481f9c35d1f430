"""Whether other libraries may print their routine output in rl8's commands and envs: warp's line
for each kernel module it loads (``Module ... (cached)``, :mod:`rl8.envs.mjlab`) and MLflow's
progress bars of artifact transfers (``rl8 eval RUN_ID`` downloading a policy) are left out
unless verbose: the ``rl8`` commands' ``-v/--verbose``, or the environment variable
``RL8_VERBOSE=1``, which the processes rl8 starts (sweep trials, env workers) inherit."""

from __future__ import annotations

import os

__all__ = ["MLFLOW_PROGRESS_BAR_ENV", "VERBOSE_ENV", "apply_verbosity", "is_verbose"]

#: The environment variable that asks for the other libraries' routine output (any value but
#: empty or ``0``).
VERBOSE_ENV = "RL8_VERBOSE"
#: MLflow's switch of its progress bars of artifact downloads and uploads
#: (``mlflow.environment_variables``; read at each transfer).
MLFLOW_PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def is_verbose() -> bool:
    """Whether :data:`VERBOSE_ENV` asks for the other libraries' routine output."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def apply_verbosity(verbose: bool) -> None:
    """What an ``rl8`` command does with its ``-v/--verbose`` flag (``verbose``) before it runs:
    verbose sets :data:`VERBOSE_ENV` to ``1``; otherwise, unless :data:`VERBOSE_ENV` is set,
    MLflow's artifact progress bars are turned off (:data:`MLFLOW_PROGRESS_BAR_ENV` ``false``),
    unless the user set that variable."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    if not is_verbose():
        os.environ.setdefault(MLFLOW_PROGRESS_BAR_ENV, "false")
