"""Hyper-parameter validation and schedules."""

from __future__ import annotations

import dataclasses
import math
import re

import hparams
import pytest
import torch

from rl8 import PPO, Trainer, save_policy
from rl8.cli import main
from rl8.envs import CartPole
from rl8.policies.models import Model, check_model_config
from rl8.policies.recurrent import GRUModel
from rl8.ppo.hparams import HParams
from rl8.ppo.schedules import Schedule

SMALL = {**hparams.SMALL, "num_envs": 4, "sgd_minibatch_size": 16}


def test_defaults_are_valid_and_frozen():
    hp = HParams()
    assert hp.batch_size == hp.num_envs * hp.horizon
    with pytest.raises(dataclasses.FrozenInstanceError):
        hp.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("num_envs", 0, "num_envs: expected an int >= 1, got 0"),
        ("horizon", 2.5, "horizon: expected an int >= 1, got 2.5"),
        ("horizons_per_env_reset", 0, "horizons_per_env_reset: expected a non-zero int"),
        ("gamma", 1.5, "gamma: expected a number in [0, 1], got 1.5"),
        ("lr", -1e-3, "lr: expected a finite number > 0, got -0.001"),
        ("lr", math.inf, "lr: expected a finite number > 0, got inf"),
        ("lr", math.nan, "lr: expected a finite number > 0, got nan"),
        ("num_envs", 1e12, "num_envs: expected an int >= 1, got 1000000000000.0"),
        ("seed", 2**70, f"seed: expected an int in [0, 2**63 - 1] or None, got {2**70}"),
        ("seed", -1, "seed: expected an int in [0, 2**63 - 1] or None, got -1"),
        (
            "distribution_cls",
            torch.nn.Linear,
            "distribution_cls: expected an rl8 Distribution subclass (rl8.policies.distributions.Distribution) or "
            "its dotted path, got <class 'torch.nn.modules.linear.Linear'> (the class torch.nn.modules.linear.Linear)",
        ),
        (
            "model_cls",
            torch.nn.Linear,
            "model_cls: expected an rl8 Model subclass (rl8.policies.models.Model) or its dotted "
            "path, got",
        ),
        (
            "optimizer_cls",
            torch.nn.Linear,
            "optimizer_cls: expected a torch.optim.Optimizer subclass or its dotted path",
        ),
        (
            "optimizer_cls",
            None,
            "optimizer_cls: expected a torch.optim.Optimizer subclass or its dotted path, got None",
        ),
        ("clip_param", 0, "clip_param: expected a finite number > 0, got 0"),
        ("dual_clip_param", 0.5, "dual_clip_param: expected a number > 1 or None, got 0.5"),
        ("vf_clip_param", -1.0, "vf_clip_param: expected a number > 0 or None"),
        ("entropy_coeff", -0.1, "entropy_coeff: expected a number >= 0"),
        ("normalize_rewards", 1, "normalize_rewards: expected a bool, got 1"),
        ("schedule_kind", "cosine", "schedule_kind: expected 'step' or 'linear'"),
        (
            "normalize_advantages_over",
            "batch",
            "hparam normalize_advantages_over: expected 'minibatch' or 'rollout', got 'batch'",
        ),
        ("seed", "0", "seed: expected an int in [0, 2**63 - 1] or None, got '0'"),
        ("check_finite_collects", -2, "check_finite_collects: expected an int >= -1"),
        ("device", "cuda:99", "device"),
    ],
)
def test_invalid_values_name_field_expected_and_given(field, value, fragment):
    if field == "device":
        if torch.cuda.is_available():
            pytest.skip("CUDA present")
    with pytest.raises(ValueError) as err:
        HParams(**{field: value})
    assert fragment in str(err.value)


def test_a_cuda_device_index_this_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ValueError,
        match=r"hparam device: expected a device that exists \(this machine has 2 "
        r"CUDA device\(s\), cuda:0 to cuda:1\), got 'cuda:2'",
    ):
        HParams(device="cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"a device that exists \(CUDA is not available on this machine\)"
    ):
        HParams(device="cuda")


def test_minibatch_must_divide_buffer():
    with pytest.raises(ValueError, match=r"divisor of num_envs \* horizon = 10 \* 4 = 40, got 16"):
        HParams(num_envs=10, horizon=4, sgd_minibatch_size=16)
    assert HParams(num_envs=10, horizon=4, sgd_minibatch_size=20).minibatch_size == 20
    assert HParams(num_envs=10, horizon=4, sgd_minibatch_size=None).minibatch_size == 40


@pytest.mark.parametrize(
    "num_envs, horizon, expected",
    [
        (256, 32, 2048),  # the default shape: 4 minibatches of 2048, as before "auto"
        (64, 16, 256),  # the PPO(CartPole, num_envs=64, horizon=16)
        (16, 32, 128),  # docs/cli.md's --set num_envs=16
        (3, 5, 5),  # 15 transitions: 3 minibatches (4 does not divide 15)
        (2, 5, 5),  # 10 transitions: 2 minibatches
        (17, 1, 17),  # a prime batch: the whole buffer
        (1, 1, 1),
    ],
)
def test_default_minibatch_fits_every_batch_shape(num_envs, horizon, expected):
    hp = HParams(num_envs=num_envs, horizon=horizon)
    assert hp.sgd_minibatch_size == "auto" and hp.num_minibatches is None
    assert hp.minibatch_size == expected


def test_num_minibatches_splits_the_buffer():
    assert HParams(num_envs=64, horizon=16, num_minibatches=8).minibatch_size == 128
    assert HParams(num_envs=64, horizon=16, num_minibatches=1).minibatch_size == 1024
    with pytest.raises(
        ValueError,
        match=r"num_minibatches: expected a divisor of the 1024 transitions .* "
        r"got 3; nearest valid: 2 or 4",
    ):
        HParams(num_envs=64, horizon=16, num_minibatches=3)
    with pytest.raises(ValueError, match=r"num_minibatches: expected an int >= 1 or None, got 0"):
        HParams(num_minibatches=0)
    with pytest.raises(
        ValueError,
        match=r"num_minibatches: only applies with sgd_minibatch_size='auto', "
        r"but sgd_minibatch_size=64 was given",
    ):
        HParams(num_envs=64, horizon=16, sgd_minibatch_size=64, num_minibatches=4)


@pytest.mark.parametrize(
    "size, nearest",
    [
        (1000, "nearest valid: 512 or 1024"),
        (2048, "nearest valid: 1024 \\("),
        (100, "nearest valid: 64 or 128"),
    ],
)
def test_bad_minibatch_size_names_the_nearest_valid_sizes(size, nearest):
    with pytest.raises(ValueError) as err:
        HParams(num_envs=64, horizon=16, sgd_minibatch_size=size)
    message = str(err.value)
    assert message.startswith(
        f"hparam sgd_minibatch_size: expected a divisor of num_envs * horizon = 64 * 16 = 1024, got {size}"
    )
    assert re.search(nearest, message), message


def test_minibatch_size_for_sequences():
    hp = HParams(num_envs=6, horizon=16, seq_len=8)
    assert hp.minibatch_size_for(8) == 24  # 12 sequences: 4 minibatches of 3 sequences
    with pytest.raises(
        ValueError, match=r"expected a multiple of seq_len=8 .* got 12; nearest valid: 8 or 16"
    ):
        hp.replace(sgd_minibatch_size=12).minibatch_size_for(8)
    with pytest.raises(
        ValueError,
        match=r"divisor of the 12 sequences of seq_len=8 steps .* got 8; nearest valid: 6 or 12",
    ):
        hp.replace(num_minibatches=8).minibatch_size_for(8)


def test_seed_range_ends_are_valid():
    assert HParams(seed=0).seed == 0
    assert HParams(seed=2**63 - 1).seed == 2**63 - 1


def test_unknown_name_suggests_close_match():
    with pytest.raises(TypeError, match="unknown hyper-parameter 'gama'.*did you mean 'gamma'"):
        HParams.from_kwargs(gama=0.9)


def test_every_unknown_name_is_reported_with_what_it_means():
    """Stable-Baselines3's keywords: all of them in one error, each with rl8's way."""
    sb3 = dict(net_arch=[64], verbose=1, tensorboard_log="runs", use_sde=True, norm_obs=True)
    with pytest.raises(TypeError) as error:
        HParams.from_kwargs(**sb3, n_steps=8, normalize_advantage=True, gama=0.9)
    message = str(error.value)
    assert message.startswith("8 unknown hyper-parameters (valid: num_envs, horizon, ")
    for line in [
        "'net_arch': Stable-Baselines3's net_arch=[64, 64] is model_config={'hiddens': [64, 64]}",
        "'verbose': PPO prints nothing; Trainer(algo).run() prints a progress line on stderr: "
        "Trainer(algo, progress=False) turns it off",
        "'tensorboard_log': rl8 logs to MLflow, not TensorBoard: Trainer(algo, tracking_uri=..., "
        "experiment=...) says where",
        "'use_sde': rl8 has no gSDE (state-dependent exploration); a Gaussian policy's std is a "
        "learned parameter (the default) or an output of the network: "
        "model_config={'state_dependent_std': True}",
        "'norm_obs': did you mean 'normalize_observations'?",
        "'n_steps': did you mean 'horizon'",
        "'normalize_advantage': did you mean 'normalize_advantages'",
        "'gama': did you mean 'gamma'?",
    ]:
        assert f"\n  {line}" in message
    with pytest.raises(ValueError) as error:  # a config file's hparams: all of them too
        HParams.read_config({"n_epochs": 4, "ent_coef": 0.0}, "run.yaml: hparams")
    message = str(error.value)
    assert message.startswith("run.yaml: hparams: 2 unknown hyper-parameters (valid: num_envs, ")
    assert (
        "\n  'n_epochs': did you mean 'num_sgd_iters'?\n  'ent_coef': did you mean 'entropy_coeff'"
        in message
    )


def test_seq_len_must_divide_horizon():
    with pytest.raises(ValueError, match="seq_len: expected an int >= 1 that divides horizon=32, got 5"):
        HParams(seq_len=5)


def test_normalize_advantages_over_needs_normalize_advantages():
    message = (
        "hparam normalize_advantages_over: only applies with normalize_advantages=True, but "
        "normalize_advantages=False was given with normalize_advantages_over='rollout'; set one of the two"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        HParams(normalize_advantages=False, normalize_advantages_over="rollout")
    assert HParams(normalize_advantages=False).normalize_advantages_over == "minibatch"


def test_lr_in_optimizer_kwargs_is_rejected():
    with pytest.raises(ValueError, match="optimizer_kwargs"):
        HParams(optimizer_kwargs={"lr": 0.1})


def test_schedule_validation_names_the_field():
    with pytest.raises(ValueError, match="lr_schedule: env_steps must be strictly increasing"):
        HParams(lr_schedule=[(0, 1e-3), (0, 1e-4)])
    with pytest.raises(ValueError, match="lr_schedule: expected learning rates > 0"):
        HParams(lr_schedule=[(0, 1e-3), (10, 0.0)])


def test_step_and_linear_schedules():
    step = Schedule([(0, 1.0), (100, 0.5)], "step")
    assert step(0) == 1.0 and step(99) == 1.0 and step(100) == 0.5 and step(10**9) == 0.5
    lin = Schedule([(0, 1.0), (100, 0.0)], "linear")
    assert lin(50) == pytest.approx(0.5) and lin(200) == 0.0
    late = Schedule([(10, 2.0), (20, 4.0)], "linear")
    assert late(0) == 2.0 and late(15) == pytest.approx(3.0)
    hp = HParams(lr=3e-4)
    assert hp.lr_at()(12345) == 3e-4


def test_each_field_declares_its_check_and_doc():
    """A hyper-parameter is one field: its check makes the error, its doc the docstring line."""
    for f in dataclasses.fields(HParams):
        assert callable(f.metadata["check"]) and f.metadata["doc"], f.name
        assert f"        {f.name}: {f.metadata['doc']}" in HParams.__doc__
    # the message is made from the field's check
    expected = dataclasses.fields(HParams)[0].metadata["check"](0, "num_envs")
    with pytest.raises(ValueError, match=re.escape(f"hparam num_envs: expected {expected}, got 0")):
        HParams(num_envs=0)


def test_to_plain_is_what_checkpoints_store_and_reads_back():
    from rl8.policies.models import MLPModel

    hp = HParams(model_cls=MLPModel, lr_schedule=[[0, 1e-3], [10, 1e-4]], num_envs=4, horizon=8)
    plain = hp.to_plain()
    assert (
        plain["model_cls"] == "rl8.policies.models.MLPModel"
        and plain["optimizer_cls"] == "torch.optim.Adam"
    )
    assert plain["device"] == "auto" and plain["lr_schedule"] == ((0, 1e-3), (10, 1e-4))
    assert HParams.from_config(plain).to_plain() == plain


def test_config_numbers_are_read_once_for_every_reader():
    from rl8.fields import read_numbers

    assert read_numbers({"a": ["3e-4", "12", "x"], "b": 2.0}) == {"a": [3e-4, 12, "x"], "b": 2.0}
    assert read_numbers(["1e3", 2.0, 2.5], whole_as_int=True) == [1000, 2, 2.5]
    # int fields take whole floats (YAML's 1e3 or 1.0e3), float fields keep them
    assert HParams.read_config({"num_envs": "1e1", "horizon": 8.0, "lr": "1e-3", "gamma": 1.0}) == {
        "num_envs": 10,
        "horizon": 8,
        "lr": 1e-3,
        "gamma": 1.0,
    }


def test_changed_hparams_names_what_a_resume_would_change():
    from rl8.ppo.hparams import HParams, changed_hparams

    stored = HParams(horizon=32).to_plain()
    del stored["desired_kl"]  # a checkpoint older than the hyper-parameter: its default
    given = HParams(horizon=64, device="cpu").to_plain()
    assert changed_hparams(stored, given, may_change=("device",)) == {"horizon": (32, 64)}
    assert changed_hparams(stored, {**given, "desired_kl": 0.01}, may_change=("device",)) == {
        "horizon": (32, 64),
        "desired_kl": (None, 0.01),
    }
    assert changed_hparams(stored, HParams(horizon=32).to_plain()) == {}


def test_model_config_keys_follow_the_model_class():
    with pytest.raises(
        ValueError, match=r"model_config\.hiddens: GRUModel has no option 'hiddens'.*'hidden_size'"
    ):
        check_model_config(GRUModel, {"hiddens": [8]})
    check_model_config(GRUModel, {"hidden_size": 8})

    class Anything(Model):  # takes **config: every key is its business
        pass

    check_model_config(Anything, {"whatever": 1})


@pytest.mark.parametrize(
    "optimizer, eps",
    [
        ("torch.optim.SGD", None),
        ("torch.optim.RMSprop", 1e-8),
        ("torch.optim.Adam", 1e-5),
        ("torch.optim.AdamW", 1e-5),
    ],
)
def test_adams_default_eps_goes_to_adam_and_adamw_only(optimizer, eps):
    algo = PPO(CartPole, **SMALL, optimizer_cls=optimizer)
    assert algo.optimizer.defaults.get("eps") == eps
    assert algo.hparams.optimizer_kwargs == ({} if eps != 1e-5 else {"eps": 1e-5})
    with pytest.raises(ValueError, match="SGD refused"):  # given explicitly: still checked
        PPO(CartPole, **SMALL, optimizer_cls="torch.optim.SGD", optimizer_kwargs={"eps": 1e-5})


def test_sizes_that_could_never_fit_are_refused_before_allocating(tmp_path, capsys):
    small = dict(num_envs=4, horizon=4, sgd_minibatch_size=16)
    with pytest.raises(
        ValueError, match=r"model_config \{'hiddens': \[10000000, 10000000\]\} \(MLPModel\) needs about"
    ):
        PPO(CartPole, **small, model_config={"hiddens": [10**7, 10**7]})
    algo = PPO(CartPole, **small)
    with pytest.raises(
        ValueError, match=r"eval_num_envs=1000000000000 needs about .* Use fewer eval envs"
    ):
        Trainer(algo, eval_num_envs=10**12, tracking=False)
    policy = save_policy(
        algo.policy,
        tmp_path / "p.pt",
        env={"spec": "rl8.envs.cartpole.CartPole", "env_kwargs": {}, "env_config": {}},
    )
    assert main(["eval", str(policy), "--num-envs", str(10**12)]) == 2
    assert "1000000000000 envs (--num-envs) needs about" in capsys.readouterr().err
