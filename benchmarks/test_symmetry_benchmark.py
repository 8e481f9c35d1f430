"""benchmarks/symmetry.py's mirror of Catch: a true symmetry of the game."""

from __future__ import annotations

import torch
from symmetry import mirror_catch

from rl8.envs import Catch


def test_mirror_catch_is_a_symmetry_of_the_game():
    # the mirrored game played with the mirrored actions shows the mirrored images and scores alike
    game, mirrored = Catch(64, rows=5, cols=5), Catch(64, rows=5, cols=5)
    obs, _ = game.reset(seed=0), mirrored.reset(seed=0)
    mirrored.ball_col, mirrored.paddle = 4 - game.ball_col, 4 - game.paddle
    generator = torch.Generator().manual_seed(0)
    mirrored_obs = None  # the mirrored game's first frames: set above, not observed
    for _ in range(4):  # one episode: the ball lands on the fourth step
        actions = torch.randint(3, (64,), generator=generator)
        both_obs, both_actions = mirror_catch(obs=obs, actions=actions)
        assert torch.equal(both_obs[:64], obs) and torch.equal(both_actions[:64], actions)
        if mirrored_obs is not None:
            assert torch.equal(both_obs[64:], mirrored_obs)
        out, mirrored_out = game.step(actions), mirrored.step(both_actions[64:])
        assert torch.equal(out["rewards"], mirrored_out["rewards"])
        assert torch.equal(mirrored_out["final_obs"], out["final_obs"].flip(-1))
        obs, mirrored_obs = out["obs"], mirrored_out["obs"]
    assert out["terminated"].all() and (out["rewards"].abs() == 1).all()
