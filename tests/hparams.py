"""The hyper-parameters of the tests' short PPO runs, one definition for every test file
(``from hparams import SMALL, STEP``); a file that needs a variant spells out only what differs:
``SMALL = {**hparams.SMALL, "num_envs": 4}``."""

from __future__ import annotations

#: PPO on a CartPole-sized env that trains a step in milliseconds: 16 envs x 8 steps, one pass of
#: two minibatches, seeded.
SMALL = dict(num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)
#: env steps per training step of SMALL
STEP = SMALL["num_envs"] * SMALL["horizon"]
