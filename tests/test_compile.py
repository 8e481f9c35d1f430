"""``compile=True`` (rl8.ppo.compiled) and the dtype ``enable_amp`` chooses (rl8.ppo.precision).

Each torch.compile takes tens of seconds on a 2-core CPU: the compiling tests are few, use tiny
networks, and live in this one file so that pytest-xdist runs it beside the rest.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rl8 import PPO, LSTMModel
from rl8.envs import CartPole, Pendulum

TINY = dict(num_envs=16, horizon=8, num_sgd_iters=1, seed=0, model_config={"hiddens": (16, 16)})


# ---------------------------------------------------------------------------------- compile=True
def test_compile_bad_value_names_the_field():
    with pytest.raises(ValueError, match=r"hparam compile: expected a bool, got 'yes'"):
        PPO(CartPole, num_envs=4, horizon=4, compile="yes")


def test_compile_with_overlap_names_both_options():
    with pytest.raises(ValueError, match=r"hparam compile: compile=True does not work with collect_mode='overlap'"):
        PPO(CartPole, num_envs=4, horizon=4, compile=True, collect_mode="overlap")


@pytest.mark.parametrize("env", [CartPole, Pendulum], ids=["categorical", "normal"])
def test_compiled_steps_match_eager_without_graph_breaks(env):
    """The compiled rollout step and minibatch loss (and its gradients) agree with the plain ones on
    the same batch; ``fullgraph=True`` makes any graph break an error."""
    algo = PPO(env, **TINY)
    algo.collect()
    samples, _ = algo._training_samples()
    minibatch = samples[:64]
    params = [p for p in algo.policy.parameters() if p.requires_grad]

    def loss_and_grads(minibatch_loss):
        algo.optimizer.zero_grad()
        loss = minibatch_loss(minibatch, 0.01)
        loss.total.backward()
        return loss, [p.grad.clone() for p in params]

    eager, eager_grads = loss_and_grads(algo._minibatch_loss)
    compiled, compiled_grads = loss_and_grads(torch.compile(algo._minibatch_loss, fullgraph=True))
    for name in ("total", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name), rtol=1e-4, atol=1e-5, msg=name)
    for eager_grad, compiled_grad in zip(eager_grads, compiled_grads, strict=True):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-4, atol=1e-5)

    obs, actions = minibatch["obs"], minibatch["actions"]
    with torch.no_grad():
        dist, value, carry = algo.policy.rollout_step(obs, None)
        compiled_dist, compiled_value, compiled_carry = torch.compile(algo.policy.rollout_step, fullgraph=True)(obs, None)
    assert carry is None and compiled_carry is None
    torch.testing.assert_close(compiled_value, value, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled_dist.log_prob(actions), dist.log_prob(actions), rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def compiled_cartpole():
    """PPO(CartPole) with the defaults and compile=True, trained as in
    tests/test_learning.py::test_cartpole_defaults_solve (same target, same env-step bound),
    and the stats of its first two updates."""
    algo = PPO(CartPole, seed=0, compile=True)
    eval_env, updates, best = CartPole(32), [], -float("inf")
    while algo.env_steps < 600_000:
        algo.collect()
        updates.append(algo.update())
        if algo.steps % 2 == 0:
            best = max(best, algo.evaluate(eval_env, num_steps=500)["episodes/return_mean"])
            if best >= 475:
                break
    return algo, updates[:2], best


@pytest.mark.slow
def test_compiled_cartpole_learns_within_the_eager_bound(compiled_cartpole):
    _, _, best = compiled_cartpole
    assert best >= 475


def test_compile_time_is_reported_once(compiled_cartpole, caplog):
    algo, (first, second), _ = compiled_cartpole
    assert first["profiling/compile_ms"] > 0
    assert "profiling/compile_ms" not in second
    assert algo.compiled.compile_s * 1000 == pytest.approx(first["profiling/compile_ms"])


def test_compiled_checkpoints_keep_plain_keys_both_ways(compiled_cartpole, tmp_path):
    """A compile=True checkpoint loads into compile=False and the other way round; the policy's
    keys are the plain module's (no ``_orig_mod.``)."""
    algo, _, _ = compiled_cartpole
    torch.save(algo.state_dict(), tmp_path / "compiled.pt")
    state = torch.load(tmp_path / "compiled.pt", weights_only=True)
    plain = PPO(CartPole, seed=0)
    assert list(state["policy"]) == list(plain.policy.state_dict())
    plain.load_state_dict(state)
    obs = torch.randn(8, 4)
    torch.testing.assert_close(plain.policy.value(obs), algo.policy.value(obs))

    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    again = PPO(CartPole, seed=0, compile=True)
    again.load_state_dict(torch.load(tmp_path / "plain.pt", weights_only=True))
    torch.testing.assert_close(again.policy.value(obs), algo.policy.value(obs))
    again.collect()
    assert torch.isfinite(torch.tensor(again.update()["losses/total"]))


def test_compile_with_a_recurrent_model_and_amp(caplog):
    """compile=True trains a recurrent model under enable_amp (nn.LSTM itself runs eagerly: torch.compile
    does not trace it) and reports the compile time in one log line."""
    caplog.set_level(logging.INFO, logger="rl8.ppo.compiled")
    algo = PPO(CartPole, num_envs=8, horizon=8, seq_len=4, num_sgd_iters=1, seed=0, model_cls=LSTMModel,
               model_config={"hidden_size": 8, "encoder_hiddens": (8,)}, enable_amp=True, compile=True)
    algo.collect()
    stats = algo.update()
    assert stats["profiling/compile_ms"] > 0 and torch.isfinite(torch.tensor(stats["losses/total"]))
    assert [r.message for r in caplog.records if "torch.compile took" in r.message]


# ---------------------------------------------------------------------------------- bf16 on CPU
@pytest.mark.parametrize("capability, dtype", [("AVX512", torch.bfloat16), ("AVX2", torch.float32)])
def test_enable_amp_on_cpu_reports_its_dtype(monkeypatch, caplog, capability, dtype):
    """bfloat16 where the CPU runs it fast; else float32 with a warning naming why. Either way a
    log line and the MLflow param ``amp_dtype`` say what was chosen."""
    from rl8.training.config import TrainerConfig, run_params

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    caplog.set_level(logging.INFO, logger="rl8.ppo.precision")
    if dtype == torch.float32:
        with pytest.warns(UserWarning, match=r"enable_amp: training in float32 .* 'AVX2'"):
            algo = PPO(CartPole, num_envs=4, horizon=4, device="cpu", enable_amp=True)
    else:
        algo = PPO(CartPole, num_envs=4, horizon=4, device="cpu", enable_amp=True)
    name = str(dtype).removeprefix("torch.")
    assert algo.amp_dtype == dtype
    assert any(f"autocast dtype {name}" in r.message for r in caplog.records)
    assert run_params(algo, TrainerConfig(), None, algo.dist)["amp_dtype"] == name
    with algo._autocast():
        assert torch.is_autocast_enabled("cpu") == (dtype == torch.bfloat16)


def test_amp_off_is_float32_without_autocast():
    algo = PPO(CartPole, num_envs=4, horizon=4, device="cpu")
    assert algo.amp_dtype == torch.float32
    with algo._autocast():
        assert not torch.is_autocast_enabled("cpu")
