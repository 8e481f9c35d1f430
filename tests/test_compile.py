"""``compile=True`` (rl8.ppo.compiled) and the dtype ``enable_amp`` chooses (rl8.ppo.precision).

Each torch.compile takes tens of seconds on a 2-core CPU: the compiling tests are few, use tiny
networks, and live in this one file so that pytest-xdist runs it beside the rest.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rl8 import PPO, LSTMModel, MLPModel
from rl8.envs import CartPole, Pendulum
from rl8.ppo.compiled import (
    CompiledLossStep,
    CompiledSteps,
    FusedStep,
    FusedTrainStep,
    fused_step_problem,
)
from rl8.ppo.update_step import EagerStep

TINY = dict(num_envs=16, horizon=8, num_sgd_iters=1, seed=0, model_config={"hiddens": (16, 16)})


# ---------------------------------------------------------------------------------- compile=True
def test_compile_bad_value_names_the_field():
    with pytest.raises(ValueError, match=r"hparam compile: expected a bool, got 'yes'"):
        PPO(CartPole, num_envs=4, horizon=4, compile="yes")


def test_compile_with_overlap_names_both_options():
    with pytest.raises(
        ValueError, match=r"hparam compile: compile=True does not work with collect_mode='overlap'"
    ):
        PPO(CartPole, num_envs=4, horizon=4, compile=True, collect_mode="overlap")


@pytest.mark.slow
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
        torch.testing.assert_close(
            getattr(compiled, name), getattr(eager, name), rtol=1e-4, atol=1e-5, msg=name
        )
    for eager_grad, compiled_grad in zip(eager_grads, compiled_grads, strict=True):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-4, atol=1e-5)

    obs, actions = minibatch["obs"], minibatch["actions"]
    with torch.no_grad():
        dist, value, carry = algo.policy.rollout_step(obs, None)
        compiled_dist, compiled_value, compiled_carry = torch.compile(
            algo.policy.rollout_step, fullgraph=True
        )(obs, None)
    assert carry is None and compiled_carry is None
    torch.testing.assert_close(compiled_value, value, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        compiled_dist.log_prob(actions), dist.log_prob(actions), rtol=1e-4, atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("min_envs, kind", [(None, "plain"), (4, "compiled")])
def test_cpu_rollout_step_compiled_only_from_enough_envs(caplog, min_envs, kind):
    """On CPU the rollout step runs plain below ``cpu_rollout_min_envs`` envs (said once in the
    log; nothing compiled for it) and compiled from there; either way the collect fills the
    buffer and the update runs compiled."""
    algo = PPO(CartPole, **{**TINY, "num_envs": 4}, compile=True)
    if min_envs is not None:
        algo.compiled.cpu_rollout_min_envs = min_envs
    caplog.set_level(logging.INFO, logger="rl8.ppo.compiled")
    algo.collect()
    algo.collect()
    assert algo.compiled.rollout_step_kind == kind
    plain_lines = [r.message for r in caplog.records if "the rollout step runs plain" in r.message]
    if kind == "plain":
        assert plain_lines == [
            "rl8: compile=True: the rollout step runs plain: 4 envs, fewer than "
            "the 64 for which compiling it pays on CPU"
        ]
        assert algo.compiled.compile_s == 0.0  # the update has not run yet, the rollout never compiles
    else:
        assert not plain_lines and algo.compiled.compile_s > 0
    assert torch.isfinite(torch.tensor(algo.update()["losses/total"]))
    assert algo.compiled.train_step_kind == "fused"


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


@pytest.mark.slow
def test_compile_time_is_reported_once(compiled_cartpole, caplog):
    algo, (first, second), _ = compiled_cartpole
    assert algo.compiled.train_step_kind == "fused"
    assert first["profiling/compile_ms"] > 0
    assert "profiling/compile_ms" not in second
    assert algo.compiled.compile_s * 1000 == pytest.approx(first["profiling/compile_ms"])


@pytest.mark.slow
def test_compiled_checkpoints_keep_plain_keys_both_ways(compiled_cartpole, tmp_path):
    """A compile=True checkpoint (after fused steps) loads into compile=False, which steps on from
    its Adam state, and the other way round; the policy's keys are the plain module's (no
    ``_orig_mod.``)."""
    algo, _, _ = compiled_cartpole
    torch.save(algo.state_dict(), tmp_path / "compiled.pt")
    state = torch.load(tmp_path / "compiled.pt", weights_only=True)
    plain = PPO(CartPole, seed=0)
    assert list(state["policy"]) == list(plain.policy.state_dict())
    plain.load_state_dict(state)
    obs = torch.randn(8, 4)
    torch.testing.assert_close(plain.policy.value(obs), algo.policy.value(obs))
    # the fused step's Adam state is torch's: the plain optimizer takes it and steps on from it
    steps = float(state["optimizer"]["state"][0]["step"])
    assert steps > 0 and plain.optimizer.state_dict()["state"][0]["step"] == steps
    plain.collect()
    assert torch.isfinite(torch.tensor(plain.update()["losses/total"]))
    assert float(plain.optimizer.state_dict()["state"][0]["step"]) > steps

    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    again = PPO(CartPole, seed=0, compile=True)
    again.load_state_dict(torch.load(tmp_path / "plain.pt", weights_only=True))
    torch.testing.assert_close(again.policy.value(obs), plain.policy.value(obs))
    steps = float(plain.optimizer.state_dict()["state"][0]["step"])
    again.collect()
    assert torch.isfinite(torch.tensor(again.update()["losses/total"]))
    assert again.compiled.train_step_kind == "fused"
    assert float(again.optimizer.state_dict()["state"][0]["step"]) > steps


@pytest.mark.slow
def test_compile_with_a_recurrent_model_and_amp(caplog):
    """compile=True trains a recurrent model under enable_amp (nn.LSTM itself runs eagerly: torch.compile
    does not trace it) and reports the compile time in one log line."""
    caplog.set_level(logging.INFO, logger="rl8.ppo.compiled")
    algo = PPO(
        CartPole,
        num_envs=8,
        horizon=8,
        seq_len=4,
        num_sgd_iters=1,
        seed=0,
        model_cls=LSTMModel,
        model_config={"hidden_size": 8, "encoder_hiddens": (8,)},
        enable_amp=True,
        compile=True,
    )
    algo.collect()
    stats = algo.update()
    assert stats["profiling/compile_ms"] > 0 and torch.isfinite(torch.tensor(stats["losses/total"]))
    assert algo.compiled.train_step_kind == "loss"
    assert [
        r.message for r in caplog.records if "torch.compile took" in r.message and "nn.LSTM" in r.message
    ]


# ---------------------------------------------------------------------------------- the fused train step
def _plain_step(algo, minibatch, entropy_coeff):
    """PPO's plain (eager) minibatch step, as ``PPO.update`` takes it without compile."""
    loss = algo._minibatch_loss(minibatch, entropy_coeff)
    algo.optimizer.zero_grad()
    loss.total.backward()
    return loss, algo._optimizer_step()


def _minibatches(algo, count):
    algo.collect()
    samples, _ = algo._training_samples()
    size = samples.batch_size[0] // count
    return [samples[i * size : (i + 1) * size] for i in range(count)]


MONITORS = ("total", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer, max_grad_norm",
    [
        (
            dict(optimizer_cls="torch.optim.Adam", optimizer_kwargs={"eps": 1e-5, "weight_decay": 0.01}),
            0.05,
        ),
        (
            dict(
                optimizer_cls="torch.optim.AdamW",
                optimizer_kwargs={"eps": 1e-5, "weight_decay": 0.1, "betas": (0.8, 0.99)},
            ),
            None,
        ),
    ],
    ids=["adam-clipped", "adamw-unclipped"],
)
def test_fused_step_matches_the_plain_step(optimizer, max_grad_norm):
    """Over several optimizer steps on the same minibatches, the fused step and the plain eager step
    give the same losses, monitors and grad norms at every step, then the same parameters and Adam
    state (``optimizer.state_dict()``, same keys); Adam's coupled and AdamW's decoupled weight
    decay, grad-norm clipping that scales (0.05 is below every norm here) and none."""
    kwargs = dict(TINY, **optimizer, max_grad_norm=max_grad_norm, entropy_coeff=0.01)
    plain, fused_algo = PPO(Pendulum, **kwargs), PPO(Pendulum, **kwargs)
    fused = FusedTrainStep(
        fused_algo.policy, fused_algo.optimizer, fused_algo._minibatch_loss, max_grad_norm
    )
    for lr in (1e-3, 3e-3):  # a new lr (a schedule) between the updates
        for algo in (plain, fused_algo):
            # as a resume does: new param group dicts and state tensors, which the fused step must follow
            algo.optimizer.load_state_dict(algo.optimizer.state_dict())
            algo.optimizer.param_groups[0]["lr"] = lr
        for minibatch in _minibatches(plain, 4) * 2:
            plain_loss, plain_norm = _plain_step(plain, minibatch, 0.01)
            fused_loss, fused_norm = fused(minibatch, 0.01)
            for name in MONITORS:
                torch.testing.assert_close(
                    getattr(fused_loss, name),
                    getattr(plain_loss, name).detach(),
                    rtol=1e-4,
                    atol=1e-5,
                    msg=name,
                )
            torch.testing.assert_close(fused_norm, plain_norm, rtol=1e-4, atol=1e-5)
            if max_grad_norm is not None:
                assert plain_norm > max_grad_norm  # the clip scaled this step's gradients
    for (name, p), q in zip(
        plain.policy.named_parameters(), fused_algo.policy.parameters(), strict=True
    ):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)
    plain_state, fused_state = plain.optimizer.state_dict(), fused_algo.optimizer.state_dict()
    assert fused_state["param_groups"] == plain_state["param_groups"]
    for i, state in plain_state["state"].items():
        assert set(fused_state["state"][i]) == set(state)
        for key, value in state.items():
            fused_value = fused_state["state"][i][key]
            assert fused_value.dtype == value.dtype and fused_value.device == value.device
            torch.testing.assert_close(fused_value, value, rtol=1e-4, atol=1e-6, msg=f"{i} {key}")
    assert float(fused_state["state"][0]["step"]) == 16


@pytest.mark.slow
def test_fused_step_under_bf16_autocast(monkeypatch):
    """enable_amp on a CPU with bfloat16: the fused step compiles with the autocast inside and agrees
    with the plain bfloat16 step (bfloat16's tolerance)."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    plain, fused_algo = PPO(Pendulum, **TINY, enable_amp=True), PPO(Pendulum, **TINY, enable_amp=True)
    assert fused_algo.amp_dtype == torch.bfloat16
    fused = FusedTrainStep(fused_algo.policy, fused_algo.optimizer, fused_algo._minibatch_loss, 0.5)
    for minibatch in _minibatches(plain, 2):
        plain_loss, plain_norm = _plain_step(plain, minibatch, 0.0)
        fused_loss, fused_norm = fused(minibatch, 0.0)
        for name in MONITORS:
            torch.testing.assert_close(
                getattr(fused_loss, name),
                getattr(plain_loss, name).detach(),
                rtol=0.05,
                atol=0.02,
                msg=name,
            )
        torch.testing.assert_close(fused_norm, plain_norm, rtol=0.05, atol=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("normalize_advantages_over", ["minibatch", "rollout"])
def test_compiled_update_runs_the_fused_step_and_stops_on_kl_as_the_plain_one(normalize_advantages_over):
    """PPO(compile=True).update() takes the fused step (said by ``train_step_kind``) and gives the
    plain update's stats and weights, the target_kl_div stop included (checked after each step on
    that step's approximate KL, as the plain update does), with either advantage normalisation."""
    kwargs = dict(
        TINY,
        num_sgd_iters=3,
        num_minibatches=4,
        target_kl_div=1e-4,
        lr=1e-2,
        normalize_advantages_over=normalize_advantages_over,
    )
    plain, compiled = PPO(Pendulum, **kwargs), PPO(Pendulum, **kwargs, compile=True)
    assert compiled.compiled.train_step_kind == "fused" and compiled.compiled.train_step_fallback is None
    for algo in (plain, compiled):
        algo.collect()
    plain_stats, compiled_stats = plain.update(), compiled.update()
    steps = int(plain.optimizer.state_dict()["state"][0]["step"])
    assert 1 <= steps < 12  # stopped early
    assert int(compiled.optimizer.state_dict()["state"][0]["step"]) == steps
    for name, value in plain_stats.items():
        assert compiled_stats[name] == pytest.approx(value, rel=1e-3, abs=1e-5), name
    for p, q in zip(plain.policy.parameters(), compiled.policy.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "hparams, reason",
    [
        (
            dict(optimizer_cls="torch.optim.SGD", optimizer_kwargs={}),
            "the optimizer is SGD, not torch.optim.Adam or AdamW",
        ),
        (dict(optimizer_kwargs={"amsgrad": True}), "amsgrad=True"),
        (dict(optimizer_kwargs={"maximize": True}), "maximize=True"),
        (dict(accumulate_grads=True), "accumulate_grads"),
        (dict(model_cls=LSTMModel, seq_len=4, model_config={"hidden_size": 8}), "nn.LSTM"),
    ],
)
def test_compile_falls_back_to_the_compiled_loss(hparams, reason):
    algo = PPO(CartPole, **{**TINY, **hparams}, compile=True)
    assert algo.compiled.train_step_kind == "loss"
    assert reason in algo.compiled.train_step_fallback
    assert type(algo.update_step) is CompiledLossStep


def test_the_update_step_is_chosen_once_at_construction():
    """Eager without compile; with it the fused step (the compiled-loss step its fallback)."""
    assert type(PPO(CartPole, **TINY).update_step) is EagerStep
    fused = PPO(CartPole, **TINY, compile=True).update_step
    assert type(fused) is FusedStep and type(fused.fallback) is CompiledLossStep


def test_the_fused_step_refuses_an_added_loss_term():
    algo = PPO(CartPole, **TINY, compile=True)
    algo.collect()
    with torch.no_grad():
        advantages, returns = algo.compute_advantages()
    minibatch = algo.buffer.training_samples(advantages, returns)[:8]
    with pytest.raises(ValueError, match="an extension added a loss term"):
        algo.update_step(minibatch, 0.0, torch.zeros(()), 0)


def test_fused_step_problem_names_the_grad_scaler_and_data_parallel():
    """The fallbacks that this CPU test cannot build (float16 on CUDA, several ranks)."""
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    flags = dict(grad_scaler=False, distributed=False, accumulate_grads=False, recurrent=False)
    assert fused_step_problem(optimizer, **flags) is None
    assert "gradient scaler" in fused_step_problem(optimizer, **{**flags, "grad_scaler": True})
    assert "data-parallel" in fused_step_problem(optimizer, **{**flags, "distributed": True})
    two_groups = torch.optim.Adam(
        [
            {"params": [torch.nn.Parameter(torch.zeros(2))]},
            {"params": [torch.nn.Parameter(torch.zeros(2))]},
        ]
    )
    assert "2 parameter groups" in fused_step_problem(two_groups, **flags)


class _DataDependentModel(MLPModel):
    """An MLP whose forward pass branches on a tensor's value: a graph break."""

    def forward(self, obs):
        if obs.sum() > 1e30:
            obs = obs * 0
        return super().forward(obs)


def test_fused_step_falls_back_where_torch_refuses_it(caplog):
    """A model torch.compile cannot trace in one graph: the first fused call gives ``None`` without
    changing the weights or the optimizer's step, logs why, and the compiled loss runs from then on."""
    caplog.set_level(logging.WARNING, logger="rl8.ppo.compiled")
    algo = PPO(CartPole, **TINY, model_cls=_DataDependentModel)
    fused = FusedTrainStep(algo.policy, algo.optimizer, algo._minibatch_loss, 0.5)
    steps = CompiledSteps(algo.policy.rollout_step, algo._minibatch_loss, algo.device, fused_step=fused)
    assert steps.train_step_kind == "fused"
    before = [p.detach().clone() for p in algo.policy.parameters()]
    (minibatch,) = _minibatches(algo, 1)
    assert steps.train_step(minibatch, 0.0) is None
    assert steps.train_step_kind == "loss" and steps.train_step_fallback.startswith("torch refused it")
    assert any("eager optimizer step" in r.message for r in caplog.records)
    for p, q in zip(before, algo.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    assert all(float(s.get("step", 0)) == 0 for s in algo.optimizer.state.values())
    assert steps.train_step(minibatch, 0.0) is None


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


@pytest.mark.parametrize(
    "capability, dtype", [((9, 0), torch.bfloat16), ((8, 0), torch.bfloat16), ((7, 5), torch.float16)]
)
def test_enable_amp_on_cuda_chooses_bfloat16_from_ampere_on(monkeypatch, capability, dtype):
    """bfloat16 (no gradient scaler) on GPUs that run it natively; float16 on older ones. The
    GPU is simulated: CI has none (the real one: test_enable_amp_on_this_gpu)."""
    from rl8.ppo.precision import choose_amp_dtype, cuda_amp_dtype

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert cuda_amp_dtype(torch.device("cuda", 0)) == dtype
    assert choose_amp_dtype(torch.device("cuda", 0), enable_amp=True) == dtype
    assert choose_amp_dtype(torch.device("cuda", 0), enable_amp=False) == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_enable_amp_on_this_gpu():
    """On a real GPU: bfloat16 without a scaler where it runs natively, and then the fused
    compiled step is not refused for a scaler."""
    algo = PPO(CartPole, num_envs=4, horizon=4, device="cuda", enable_amp=True)
    major, _ = torch.cuda.get_device_capability()
    assert algo.amp_dtype == (torch.bfloat16 if major >= 8 else torch.float16)
    assert (algo.grad_scaler is None) == (major >= 8)


def test_amp_off_is_float32_without_autocast():
    algo = PPO(CartPole, num_envs=4, horizon=4, device="cpu")
    assert algo.amp_dtype == torch.float32
    with algo._autocast():
        assert not torch.is_autocast_enabled("cpu")
