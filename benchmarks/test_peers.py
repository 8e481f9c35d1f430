"""The pieces of the peers benchmark (benchmarks/peers/) that run in rl8's own environment.

The CleanRL-style loop (its GAE, one iteration, the direction of its update), rl8's side and
the harness's table; rsl_rl's ``VecEnv`` adapter against rsl_rl's documented contract where
rsl_rl is importable (it lives in a virtualenv of its own, so here it is usually skipped)::

    python -m pytest benchmarks/test_peers.py -q
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "peers"))

import cleanrl_ppo  # noqa: E402
import run  # noqa: E402
import side_rl8  # noqa: E402
from workloads import WORKLOADS, batch_size, minibatch_size  # noqa: E402


def small_loop(env_id: str = "CartPole-v1", **changes) -> cleanrl_ppo.PPOLoop:
    kwargs = dict(
        num_envs=4,
        num_steps=32,
        epochs=2,
        minibatches=2,
        lr=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip=0.2,
        vf_coeff=0.5,
        max_grad_norm=0.5,
        hiddens=(16, 16),
        activation="tanh",
        seed=0,
    )
    return cleanrl_ppo.PPOLoop(env_id, **{**kwargs, **changes})


def test_gae_by_hand():
    # one env, 3 steps; the episode ends after step 1 (so the observation of step 2 starts a new one)
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    gamma, lam = 0.9, 0.8
    adv = cleanrl_ppo.gae(rewards, values, dones, torch.tensor([2.0]), torch.tensor([0.0]), gamma, lam)
    a2 = 3.0 + gamma * 2.0 - 1.5
    a1 = 2.0 - 1.0  # no bootstrap across the episode's end
    a0 = (1.0 + gamma * 1.0 - 0.5) + gamma * lam * a1
    assert adv[:, 0].tolist() == pytest.approx([a0, a1, a2])


def test_cleanrl_loop_collects_a_batch_and_updates():
    loop = small_loop()
    returns = loop.collect()
    b = loop.batch
    assert b["obs"].shape == (128, 4)
    assert b["actions"].shape == (128,)
    assert all(torch.isfinite(b[k]).all() for k in ("logprobs", "advantages", "returns"))
    assert all(r >= 1 for r in returns)  # CartPole pays 1 per step
    stats = loop.update()
    assert set(stats) == {"policy_loss", "value_loss", "approx_kl"}
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert 0.0 <= stats["approx_kl"] < 0.05
    loop.close()


def test_cleanrl_update_raises_the_likelihood_of_advantageous_actions():
    loop = small_loop(lr=1e-2, epochs=4)
    loop.collect()
    b = loop.batch
    adv = (b["advantages"] - b["advantages"].mean()) / b["advantages"].std()
    with torch.no_grad():
        before = (adv * loop.agent.dist(b["obs"]).log_prob(b["actions"])).mean()
        value_error_before = (loop.agent.value(b["obs"]) - b["returns"]).pow(2).mean()
    loop.update()
    with torch.no_grad():
        after = (adv * loop.agent.dist(b["obs"]).log_prob(b["actions"])).mean()
        value_error_after = (loop.agent.value(b["obs"]) - b["returns"]).pow(2).mean()
    assert after > before
    assert value_error_after < value_error_before
    loop.close()


def test_cleanrl_loop_on_a_box_action_space():
    loop = small_loop("Pendulum-v1", num_envs=2, num_steps=16)
    loop.collect()
    assert loop.batch["actions"].shape == (32, 1)
    assert torch.isfinite(torch.tensor(list(loop.update().values()))).all()
    loop.close()


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_valid_rl8_hparams(name):
    from rl8 import HParams

    w = WORKLOADS[name]
    assert minibatch_size(w) * w["minibatches"] == batch_size(w)
    hp = HParams.from_kwargs(**side_rl8.hparams(name, "bf16"))
    assert hp.minibatch_size == minibatch_size(w)
    assert hp.enable_amp


@pytest.mark.parametrize("setting", ["symmetry", "rnd"])
def test_the_extension_settings_train_rl8_on_the_batched_workloads(setting):
    """rl8's side of the symmetry and RND rows: rsl_rl's symmetry_cfg and rnd_cfg of
    workloads.EXTENSIONS as hparams (the RND weight times the pendulum's step_dt, as rsl_rl)."""
    from rl8 import PPO
    from rl8.envs import Pendulum

    hp = side_rl8.hparams("pendulum-1024", setting)
    assert run.reference_setting(setting) == setting
    algo = PPO(Pendulum, **{**hp, "num_envs": 16, "horizon": 8})
    algo.collect()
    assert f"losses/{setting}" in algo.update()
    if setting == "rnd":
        assert algo.rnd.weight == pytest.approx(1.0 * 0.05)


def test_rl8_side_measures_in_a_fresh_process_of_this_checkout():
    args = argparse.Namespace(threads=1, quick=True, timeout=120.0)
    result = run.measure(Path(sys.executable), run.SIDES["rl8"], "CartPole-v1", "fp32", args)
    assert "error" not in result, result
    assert result["env_steps"] == 2 * batch_size(WORKLOADS["CartPole-v1"])
    assert result["torch_threads"] == 1
    assert result["rl8_file"].startswith(str(run.ROOT / "rl8"))


def test_plan_adds_compile_rows_only_when_rl8_has_compile():
    args = argparse.Namespace(workload=["pendulum-1024", "CartPole-v1"], side=["rl8", "rsl_rl"])
    without = [(w, s.name, st) for w, s, st in run.plan(args, rl8_compiles=False)]
    assert without == [
        ("pendulum-1024", "rl8", "fp32"),
        ("pendulum-1024", "rl8", "bf16"),
        ("pendulum-1024", "rl8", "symmetry"),
        ("pendulum-1024", "rl8", "rnd"),
        ("pendulum-1024", "rsl_rl", "fp32"),
        ("pendulum-1024", "rsl_rl", "bf16"),
        ("pendulum-1024", "rsl_rl", "symmetry"),
        ("pendulum-1024", "rsl_rl", "rnd"),
        ("CartPole-v1", "rl8", "fp32"),
    ]
    with_compile = [(w, s.name, st) for w, s, st in run.plan(args, rl8_compiles=True)]
    assert ("pendulum-1024", "rl8", "compile-bf16") in with_compile
    assert ("CartPole-v1", "rl8", "compile") in with_compile


def test_table_gives_ratios_against_the_same_precision_and_says_why_a_row_is_missing():
    rows = [
        ("pendulum-1024", run.SIDES["rl8"], "fp32"),
        ("pendulum-1024", run.SIDES["rl8"], "bf16"),
        ("pendulum-1024", run.SIDES["rsl_rl"], "fp32"),
        ("pendulum-1024", run.SIDES["rsl_rl"], "bf16"),
        ("CartPole-v1", run.SIDES["sb3"], "fp32"),
    ]
    results = {
        ("pendulum-1024", "rl8", "fp32"): [{"steps_per_s": 100.0}, {"steps_per_s": 120.0}],
        ("pendulum-1024", "rl8", "bf16"): [{"steps_per_s": 300.0}, {"steps_per_s": 300.0}],
        ("pendulum-1024", "rsl_rl", "fp32"): [{"steps_per_s": 50.0}, {"steps_per_s": 60.0}],
        ("pendulum-1024", "rsl_rl", "bf16"): [{"error": "exit 1: boom"}],
    }
    notes = {("CartPole-v1", "sb3", "fp32"): "not installed: no wheel"}
    lines = run.table(rows, results, notes)
    assert "| pendulum-1024 | rsl_rl | fp32 | 55 | 2.00x | 2.00-2.00 |" in lines
    assert "| pendulum-1024 | rsl_rl | bf16 | failed: exit 1: boom | | |" in lines
    assert "| CartPole-v1 | sb3 | fp32 | not installed: no wheel | | |" in lines
    best = run.best_vs_best(rows, results)
    assert best == ["- pendulum-1024, each at its best: rl8 bf16 300 / rsl_rl fp32 55 = 5.45x"]


def test_rsl_rl_vecenv_adapter_follows_rsl_rls_contract():
    pytest.importorskip(
        "rsl_rl", reason="rsl-rl-lib is not installed here (run.py installs it in its own venv)"
    )
    from rsl_rl.env import VecEnv
    from rsl_rl.runners import OnPolicyRunner
    from rsl_rl_env import RslPendulum
    from side_rsl_rl import train_cfg

    env = RslPendulum(8, seed=0)
    assert isinstance(env, VecEnv)
    assert env.num_actions == 1 and env.max_episode_length == 200
    obs = env.get_observations()
    assert obs.batch_size == (8,) and obs["policy"].shape == (8, 3)
    for step in range(200):
        obs, rewards, dones, extras = env.step(torch.zeros(8, 1))
        assert rewards.shape == (8,) and dones.shape == (8,) and extras["time_outs"].shape == (8,)
        assert bool(dones.any()) == (step == 199)
    assert extras["time_outs"].all() and (env.episode_length_buf == 0).all()
    for extension in (None, "symmetry", "rnd"):
        cfg = train_cfg("pendulum-1024", bf16=False, extension=extension)
        cfg["num_steps_per_env"] = 4
        runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
        runner.learn(1)


def test_a_venv_that_fails_to_install_gives_pips_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("RL8_PEERS_VENVS", str(tmp_path))
    pip_error = "WARNING: something\nERROR: No matching distribution found for rsl-rl-lib==99\n"
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        failed = "pip" in cmd and "rsl-rl-lib==99" in cmd
        return run.subprocess.CompletedProcess(cmd, 1 if failed else 0, "", pip_error if failed else "")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    python, reason = run.ensure_venv(
        run.Venv("broken", ("rsl-rl-lib==99",), "rsl_rl"), log=lambda msg: None
    )
    assert python is None
    assert reason == "ERROR: No matching distribution found for rsl-rl-lib==99"
    assert calls[1][-1] == run.TORCH  # torch first, on its own
    assert not (tmp_path / "broken" / "rl8-peers-installed.txt").exists()
