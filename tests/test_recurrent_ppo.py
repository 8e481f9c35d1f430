"""Recurrent models through the one PPO code path: memory task, state handling, resume."""

from __future__ import annotations

import copy

import pytest
import torch

from rl8 import PPO
from rl8.envs import CartPole, Memory
from rl8.policies.recurrent import GRUModel, LSTMModel

RECURRENT = dict(
    num_envs=64,
    horizon=16,
    seq_len=8,
    sgd_minibatch_size=256,
    num_sgd_iters=4,
    lr=3e-3,
    gamma=0.9,
    normalize_rewards=False,
)


def memory_success(algo: PPO, delay: int, num_cues: int = 2) -> float:
    """Deterministic success rate on a fresh Memory env (mean answer reward)."""
    env = Memory(256, delay=delay, num_cues=num_cues)
    stats = algo.evaluate(env, num_steps=4 * (delay + 1))
    return stats["episodes/return_mean"]


@pytest.mark.slow
@pytest.mark.parametrize("delay,num_cues", [(4, 2), (8, 4)])
def test_lstm_solves_memory_and_feedforward_stays_at_chance(delay, num_cues):
    """Bounded by env steps with a fixed seed, never by wall time: the same run at any load.
    Seed 0 solves (4, 2) in 5,120 env steps and (8, 4) in 61,440 (docs/performance.md)."""
    env_kwargs = {"delay": delay, "num_cues": num_cues}
    lstm = PPO(
        Memory,
        model_cls=LSTMModel,
        model_config={"hidden_size": 32, "encoder_hiddens": (32,)},
        env_kwargs=env_kwargs,
        seed=0,
        **RECURRENT,
    )
    success = 0.0
    while lstm.env_steps < 120_000 and success < 0.95:
        lstm.collect()
        lstm.update()
        if lstm.steps % 5 == 0:
            success = memory_success(lstm, delay, num_cues)
    assert success >= 0.95, f"LSTM success {success:.2f} after {lstm.env_steps} env steps"

    mlp = PPO(
        Memory,
        env_kwargs=env_kwargs,
        seed=0,
        **{k: v for k, v in RECURRENT.items() if k != "seq_len"},
    )
    for _ in range(lstm.steps):
        mlp.collect()
        mlp.update()
    chance = memory_success(mlp, delay, num_cues)
    assert chance <= 1 / num_cues + 0.15, (
        f"a feedforward policy cannot remember the cue, got {chance:.2f}"
    )


def test_hidden_states_are_stored_per_sequence_and_reset_at_episode_ends():
    algo = PPO(
        Memory,
        model_cls=GRUModel,
        model_config={"hidden_size": 8},
        env_kwargs={"delay": 2},
        seed=0,
        **RECURRENT,
    )
    algo.collect()
    buf = algo.buffer
    assert buf.states.batch_size == torch.Size([64, 2])
    # episodes last 3 steps: firsts at steps 3, 6, 9, ...
    firsts = buf["firsts"][0, :16]
    assert firsts.tolist() == [t > 0 and t % 3 == 0 for t in range(16)]
    # the first sequence starts from the initial (zero) state
    assert (buf.states[:, 0]["h"] == 0).all()
    assert (buf.states[:, 1]["h"] != 0).any()
    algo.update()


def test_first_update_replays_the_collected_log_probs():
    """Training replays sequences from their stored state: the first minibatch's ratio is 1."""
    algo = PPO(
        CartPole,
        model_cls=LSTMModel,
        model_config={"hidden_size": 16},
        seed=0,
        **{**RECURRENT, "num_sgd_iters": 1, "sgd_minibatch_size": 1024},
    )
    algo.collect()
    stats = algo.update()
    assert stats["monitors/kl_div"] < 1e-6
    assert stats["monitors/clip_fraction"] == 0.0


def test_seqs_per_state_reset():
    algo = PPO(
        Memory,
        model_cls=GRUModel,
        model_config={"hidden_size": 8},
        env_kwargs={"delay": 100},
        seqs_per_state_reset=1,
        seed=0,
        **RECURRENT,
    )
    algo.collect()
    assert (algo.buffer.states["h"] == 0).all()  # reset before every sequence
    never = PPO(
        Memory,
        model_cls=GRUModel,
        model_config={"hidden_size": 8},
        env_kwargs={"delay": 100},
        seqs_per_state_reset=-1,
        seed=0,
        **RECURRENT,
    )
    never.collect()
    assert (never.buffer.states[:, 1]["h"] != 0).any()


def test_seqs_per_state_reset_counts_sequences_across_collects():
    """k = 3: the state restarts before sequences 0, 3, 6, 9 of the run, whichever collect they fall in."""
    algo = PPO(
        CartPole, model_cls=GRUModel, num_envs=4, horizon=8, seq_len=2, seqs_per_state_reset=3, seed=0
    )
    restarted = []
    for _ in range(3):
        algo.collect()
        restarted += [bool((algo.buffer.states[:, j]["h"] == 0).all()) for j in range(4)]
    assert restarted == [j % 3 == 0 for j in range(12)] and algo.carry.sequences == 12


def test_minibatch_must_hold_whole_sequences():
    with pytest.raises(ValueError, match=r"multiple of seq_len=16 .* got 8; nearest valid: 16 \("):
        PPO(Memory, model_cls=GRUModel, seed=0, **{**RECURRENT, "seq_len": 16, "sgd_minibatch_size": 8})


def test_default_minibatches_hold_whole_sequences():
    """6 envs x 16 steps in sequences of 8: 12 sequences, 4 minibatches of 3 sequences."""
    algo = PPO(
        Memory,
        model_cls=GRUModel,
        model_config={"hidden_size": 8},
        seed=0,
        **{**RECURRENT, "num_envs": 6, "sgd_minibatch_size": "auto"},
    )
    assert algo.minibatch_size == 24
    algo.collect()
    algo.update()
    steps = {int(s["step"]) for s in algo.optimizer.state.values()}
    assert steps == {RECURRENT["num_sgd_iters"] * 4}


def test_recurrent_resume_gives_identical_losses():
    kwargs = dict(model_cls=LSTMModel, model_config={"hidden_size": 8}, seed=0, **RECURRENT)
    reference = PPO(CartPole, **kwargs)
    reference.collect()
    reference.update()
    state = copy.deepcopy(reference.state_dict())
    reference.collect()
    expected = reference.update()
    resumed = PPO(CartPole, **{**kwargs, "seed": 5})
    resumed.load_state_dict(state)
    resumed.collect()
    assert resumed.update() == expected


def test_recurrent_policy_keeps_state_between_calls():
    algo = PPO(Memory, model_cls=GRUModel, model_config={"hidden_size": 8}, seed=0, **RECURRENT)
    policy = algo.policy
    obs = torch.zeros(4, algo.env.observation_space.shape[0])
    obs[:, 0] = 1.0
    policy(obs)
    first = policy.state["h"].clone()
    policy(torch.zeros_like(obs))
    assert not torch.equal(policy.state["h"], first)
    policy.reset_state(torch.tensor([True, False, False, False]))
    assert (policy.state["h"][0] == 0).all() and (policy.state["h"][1] != 0).any()
    policy.reset_state()
    assert policy.state is None


def test_trainer_checkpoint_and_saved_policy_with_a_recurrent_model(tmp_path):
    from rl8 import Trainer, load_policy

    algo = PPO(Memory, model_cls=LSTMModel, model_config={"hidden_size": 8}, seed=0, **RECURRENT)
    trainer = Trainer(algo, checkpoint_dir=tmp_path / "ckpt", eval_num_envs=8, progress=False)
    trainer.step()
    trainer.eval()
    path = trainer.save_checkpoint()
    expected = trainer.step()["losses/total"]
    trainer.close()
    resumed = Trainer.from_checkpoint(path, progress=False)
    assert resumed.algo.recurrent
    assert resumed.step()["losses/total"] == expected
    resumed.close()
    policy = load_policy(path)
    assert policy.recurrent
    obs = torch.zeros(3, algo.env.observation_space.shape[0])
    first = policy(obs)
    assert first.shape == (3,) and policy.state is not None


def test_rollout_step_carries_the_state_and_resets_it_at_episode_starts():
    """Policy.rollout_step is one interface for both kinds of model: a feedforward model has no
    carry (None in, None out); a recurrent one returns its state after the step, and an
    episode start resets an env's carry before the step."""
    ff = PPO(CartPole, num_envs=4, horizon=8, seed=0).policy
    obs = torch.randn(4, 4)
    dist, value, carry = ff.rollout_step(obs, None)
    expected_dist, expected_value = ff.distribution(obs)
    assert carry is None
    torch.testing.assert_close(value, expected_value)
    torch.testing.assert_close(ff.rollout_value(obs, None), expected_value)

    policy = PPO(CartPole, model_cls=GRUModel, num_envs=4, horizon=8, seed=0).policy
    _, _, carry = policy.rollout_step(obs, policy.initial_state(4))
    _, from_start, _ = policy.rollout_step(obs, policy.initial_state(4))
    _, carried, after = policy.rollout_step(obs, carry)
    assert not torch.equal(after["h"], carry["h"])
    starts = torch.tensor([True, False, False, True])
    _, restarted, _ = policy.rollout_step(obs, carry, starts)
    torch.testing.assert_close(restarted[starts], from_start[starts])
    torch.testing.assert_close(restarted[~starts], carried[~starts])
    torch.testing.assert_close(policy.rollout_value(obs, carry, starts), restarted)


def test_recurrent_carry_keeps_sequence_states_episode_starts_and_its_state():
    """The carry of a recurrent PPO: the state before each sequence goes to buffer.states,
    episode ends become the next step's episode starts, and its state_dict restores it."""
    from rl8.ppo.buffer import RecurrentCarry

    algo = PPO(CartPole, model_cls=GRUModel, num_envs=8, horizon=16, seq_len=4, seed=1)
    assert isinstance(algo.carry, RecurrentCarry)
    for _ in range(3):
        algo.collect()
    data = algo.buffer.data
    done = (data["terminated"] | data["truncated"])[:, :16]
    assert done.any()
    assert torch.equal(data["firsts"][:, 1:17], done)
    assert algo.carry.sequences == 3 * 16 // 4
    saved = algo.carry.state_dict()
    state, firsts = algo.carry.last()
    algo.carry.reset()
    assert (algo.carry.state["h"] == 0).all() and not algo.carry.firsts.any()
    algo.carry.load_state_dict(saved)
    assert torch.equal(algo.carry.state["h"], state["h"]) and torch.equal(algo.carry.firsts, firsts)
    assert algo.carry.sequences == 12
