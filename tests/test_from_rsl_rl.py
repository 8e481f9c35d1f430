"""``rl8.presets.from_rsl_rl``: rsl_rl runner configs (mjlab's and Isaac Lab's, written out as
``dataclasses.asdict`` gives them) as rl8 hyper-parameters, what is not mapped, bad types."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
import yaml
from group_envs import GoalPoint, GroupCartPole

from rl8 import PPO, Distillation, HParams, Trainer
from rl8.envs import Pendulum
from rl8.presets import RslRlConfigWarning, from_rsl_rl, rsl_rl_run_args, rsl_rl_teacher_args

#: mjlab 1.6's cartpole_ppo_runner_cfg() (rsl-rl-lib 5.4.2), as dataclasses.asdict gives it.
MJLAB_CARTPOLE = {
    "seed": 42,
    "num_steps_per_env": 32,
    "max_iterations": 500,
    "obs_groups": {"actor": ("actor",), "critic": ("critic",)},
    "save_interval": 50,
    "experiment_name": "cartpole",
    "run_name": "",
    "logger": "wandb",
    "wandb_project": "mjlab",
    "wandb_tags": (),
    "resume": False,
    "load_run": ".*",
    "load_checkpoint": "model_.*.pt",
    "clip_actions": None,
    "upload_model": True,
    "class_name": "OnPolicyRunner",
    "actor": {
        "hidden_dims": (64, 64),
        "activation": "elu",
        "obs_normalization": False,
        "cnn_cfg": None,
        "distribution_cfg": {
            "class_name": "GaussianDistribution",
            "init_std": 1.0,
            "std_type": "scalar",
        },
        "rnn_type": None,
        "rnn_hidden_dim": 256,
        "rnn_num_layers": 1,
        "class_name": "MLPModel",
    },
    "critic": {
        "hidden_dims": (64, 64),
        "activation": "elu",
        "obs_normalization": False,
        "cnn_cfg": None,
        "distribution_cfg": None,
        "rnn_type": None,
        "rnn_hidden_dim": 256,
        "rnn_num_layers": 1,
        "class_name": "MLPModel",
    },
    "algorithm": {
        "num_learning_epochs": 5,
        "num_mini_batches": 4,
        "learning_rate": 1e-3,
        "schedule": "adaptive",
        "gamma": 0.99,
        "lam": 0.95,
        "entropy_coef": 0.01,
        "desired_kl": 0.01,
        "max_grad_norm": 1.0,
        "value_loss_coef": 1.0,
        "use_clipped_value_loss": True,
        "clip_param": 0.2,
        "normalize_advantage_per_mini_batch": False,
        "optimizer": "adam",
        "share_cnn_encoders": False,
        "class_name": "PPO",
    },
}

#: An Isaac Lab locomotion runner config (AnymalDRoughPPORunnerCfg's values) in the older `policy`
#: form that Isaac Lab's tasks still write, with its `empirical_normalization`.
ISAACLAB_ANYMAL_D = {
    "seed": 42,
    "device": "cuda:0",
    "num_steps_per_env": 24,
    "max_iterations": 1500,
    "empirical_normalization": True,
    "obs_groups": {"policy": ["policy"], "critic": ["policy", "critic"]},
    "clip_actions": None,
    "save_interval": 50,
    "experiment_name": "anymal_d_rough",
    "run_name": "",
    "logger": "tensorboard",
    "neptune_project": "isaaclab",
    "wandb_project": "isaaclab",
    "resume": False,
    "load_run": ".*",
    "load_checkpoint": "model_.*.pt",
    "class_name": "OnPolicyRunner",
    "policy": {
        "class_name": "ActorCritic",
        "init_noise_std": 1.0,
        "noise_std_type": "scalar",
        "actor_hidden_dims": [512, 256, 128],
        "critic_hidden_dims": [768, 256, 128],
        "activation": "elu",
    },
    "algorithm": {
        "class_name": "PPO",
        "value_loss_coef": 1.0,
        "use_clipped_value_loss": True,
        "clip_param": 0.2,
        "entropy_coef": 0.005,
        "num_learning_epochs": 5,
        "num_mini_batches": 4,
        "learning_rate": 1.0e-3,
        "schedule": "adaptive",
        "gamma": 0.99,
        "lam": 0.95,
        "desired_kl": 0.01,
        "max_grad_norm": 1.0,
        "normalize_advantage_per_mini_batch": False,
        "symmetry_cfg": None,
        "rnd_cfg": None,
    },
}


def test_mjlab_cartpole():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every field is mapped: no warning
        hparams, unmapped, run_args = from_rsl_rl(MJLAB_CARTPOLE)
    assert hparams == {
        "horizon": 32,
        "lr": 1e-3,
        "num_sgd_iters": 5,
        "num_minibatches": 4,
        "clip_param": 0.2,
        "entropy_coeff": 0.01,
        "vf_coeff": 2.0,
        "max_grad_norm": 1.0,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "optimizer_cls": "torch.optim.Adam",
        "optimizer_kwargs": {},
        "normalize_rewards": False,
        "vf_clip_param": 0.2,
        "desired_kl": 0.01,
        "normalize_advantages": True,
        "normalize_advantages_over": "rollout",  # normalize_advantage_per_mini_batch=False
        "seed": 42,
        "obs_groups": {"actor": ["actor"], "critic": ["critic"]},
        "normalize_observations": False,
        "model_config": {
            "ortho_init": False,
            "hiddens": [64, 64],
            "activation": "elu",
            "init_noise_std": 1.0,
            "noise_std_type": "scalar",
        },
    }
    assert unmapped == []
    HParams.from_kwargs(**hparams)
    (condition,) = run_args["stop_conditions"]
    assert (condition.key, condition.bound) == ("algorithm/steps", 500)
    (same,) = rsl_rl_run_args(MJLAB_CARTPOLE)["stop_conditions"]
    assert (same.key, same.bound) == ("algorithm/steps", 500)


#: Isaac Lab 3.0's Isaac-Cartpole-Direct runner config as its train script hands rsl_rl 5.5.1
#: (``rl8.envs.isaaclab.isaaclab_runner_cfg``): the fields it cleared for rsl_rl 5 are ``{}``.
ISAACLAB3_CARTPOLE_DIRECT = {
    "seed": 42, "device": "cuda:0", "num_steps_per_env": 16, "init_at_random_ep_len": True,
    "max_iterations": 150, "empirical_normalization": {}, "obs_groups": {}, "clip_actions": None,
    "check_for_nan": True, "save_interval": 50, "experiment_name": "cartpole_direct",
    "run_name": "", "logger": "tensorboard", "neptune_project": "isaaclab",
    "wandb_project": "isaaclab", "resume": False, "load_run": ".*",
    "load_checkpoint": "model_.*.pt", "class_name": "OnPolicyRunner",
    "actor": {
        "class_name": "MLPModel", "hidden_dims": [32, 32], "activation": "elu",
        "obs_normalization": False,
        "distribution_cfg": {
            "class_name": "GaussianDistribution", "init_std": 1.0, "std_type": "scalar",
            "std_range": (1e-06, 1000000.0),
        },
    },
    "critic": {
        "class_name": "MLPModel", "hidden_dims": [32, 32], "activation": "elu",
        "obs_normalization": False, "distribution_cfg": None,
    },
    "algorithm": {
        "class_name": "PPO", "num_learning_epochs": 5, "num_mini_batches": 4,
        "learning_rate": 0.001, "schedule": "adaptive", "gamma": 0.99, "lam": 0.95,
        "entropy_coef": 0.005, "desired_kl": 0.01, "max_grad_norm": 1.0, "optimizer": "adam",
        "value_loss_coef": 1.0, "use_clipped_value_loss": True, "clip_param": 0.2,
        "normalize_advantage_per_mini_batch": False, "share_cnn_encoders": False,
        "use_mixed_precision": False, "rnd_cfg": None, "symmetry_cfg": None,
    },
    "torch_compile_mode": None,
    "policy": {},
}  # fmt: skip


def test_isaac_lab_3_cartpole_with_the_fields_it_cleared():
    with pytest.warns(RslRlConfigWarning):
        hparams, unmapped, _ = from_rsl_rl(ISAACLAB3_CARTPOLE_DIRECT)
    assert unmapped == [
        "device='cuda:0' (rl8's hparam device; PPO follows the env's)",
        "init_at_random_ep_len=True (no rl8 counterpart)",
        "algorithm.use_mixed_precision=False (no rl8 counterpart)",
    ]
    assert hparams["horizon"] == 16 and hparams["entropy_coeff"] == 0.005
    assert hparams["model_config"]["hiddens"] == [32, 32] and "obs_groups" not in hparams
    HParams.from_kwargs(**hparams)


def test_max_iterations_stops_the_run_after_as_many_updates():
    cfg = copy.deepcopy(MJLAB_CARTPOLE)
    cfg.update(max_iterations=2, num_steps_per_env=8)
    cfg.pop("obs_groups")
    hparams, _, run_args = from_rsl_rl(cfg)
    algo = PPO(Pendulum, num_envs=8, **{**hparams, "device": "cpu"})
    stats = Trainer(algo, progress=False, tracking=False).run(**run_args)
    # rsl_rl's run: max_iterations iterations of num_steps_per_env steps of every env
    assert (stats["algorithm/steps"], stats["env/steps"]) == (2, 2 * 8 * 8)
    assert from_rsl_rl({**cfg, "max_iterations": None}).run_args == {}


@pytest.mark.parametrize("per_minibatch, over", [(False, "rollout"), (True, "minibatch")])
def test_advantage_normalization_is_mapped_both_ways(per_minibatch, over):
    cfg = copy.deepcopy(MJLAB_CARTPOLE)
    cfg["algorithm"]["normalize_advantage_per_mini_batch"] = per_minibatch
    hparams, unmapped, _ = from_rsl_rl(cfg)
    assert (hparams["normalize_advantages"], hparams["normalize_advantages_over"]) == (True, over)
    assert not any("normalize_advantage" in entry for entry in unmapped)
    assert HParams.from_kwargs(**hparams).normalize_advantages_over == over


def test_isaac_lab_locomotion_trains_asymmetric():
    with pytest.warns(RslRlConfigWarning):
        hparams, unmapped, _ = from_rsl_rl(ISAACLAB_ANYMAL_D)
    assert hparams["obs_groups"] == {"actor": ["policy"], "critic": ["policy", "critic"]}
    assert (
        hparams["normalize_observations"]
        and hparams["entropy_coeff"] == 0.005
        and hparams["horizon"] == 24
    )
    assert hparams["model_config"] == {
        "ortho_init": False,
        "hiddens": [512, 256, 128],
        "critic_hiddens": [768, 256, 128],
        "activation": "elu",
        "init_noise_std": 1.0,
        "noise_std_type": "scalar",
    }
    assert unmapped == ["device='cuda:0' (rl8's hparam device; PPO follows the env's)"]
    algo = PPO(GroupCartPole, num_envs=8, **{**hparams, "horizon": 16, "seed": 0, "device": "cpu"})
    model = algo.policy.model
    assert (model.actor_groups, model.critic_groups) == (("policy",), ("policy", "critic"))
    assert model.vf[0].in_features == 9 and model.vf[0].out_features == 768
    assert algo.hparams.desired_kl == 0.01


def test_unmapped_fields_are_reported():
    cfg = copy.deepcopy(MJLAB_CARTPOLE)
    cfg["algorithm"].update(
        rnd_cfg={"weight": 0.1, "future_rnd_field": 1},
        normalize_advantage_per_mini_batch=True,
        schedule="fixed",
    )
    cfg["actor"]["distribution_cfg"].update(learn_std=False, std_range=[0.1, 2.0])
    cfg["critic"].update(obs_normalization=True, class_name="RNNModel", rnn_type="lstm")
    cfg["obs_groups"]["teacher"] = ["actor"]
    cfg["clip_actions"], cfg["future_field"] = 1.0, 3
    with pytest.warns(RslRlConfigWarning) as record:
        hparams, unmapped, _ = from_rsl_rl(cfg)
    assert hparams["desired_kl"] is None and hparams["normalize_observations"] is True
    for expected in (
        "algorithm.rnd_cfg.future_rnd_field=1 (no rl8 counterpart)",
        "actor.distribution_cfg.learn_std=False",
        "actor.distribution_cfg.std_range",
        "obs_normalization actor=False, critic=True",
        "critic.class_name='RNNModel'",
        "critic.rnn_type",
        "obs_groups.teacher=['actor'] (rl8 has the sets actor, critic and rnd_state)",
        "clip_actions=1.0",
        "future_field=3 (no rl8 counterpart)",
    ):
        assert any(entry.startswith(expected) for entry in unmapped), (expected, unmapped)
    assert "future_field=3" in str(record[0].message)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: c["algorithm"].update(learning_rate="1e-3"),
            "rsl_rl config algorithm.learning_rate: expected a number, got '1e-3'",
        ),
        (
            lambda c: c["actor"].update(hidden_dims=[64, -1]),
            "rsl_rl config actor.hidden_dims: expected a list of ints >= 1, got [64, -1]",
        ),
        (
            lambda c: c["critic"].update(activation="crelu"),
            "rsl_rl config critic.activation: rl8 has no activation 'crelu'",
        ),
        (
            lambda c: c["algorithm"].update(schedule="linear"),
            "rsl_rl config algorithm.schedule: expected 'adaptive' or 'fixed', got 'linear'",
        ),
        (
            lambda c: c["algorithm"].update(class_name="Distillation"),
            "rsl_rl config class_name: rl8 runs PPO (OnPolicyRunner) and Distillation (DistillationRunner), "
            "got 'OnPolicyRunner' running 'Distillation'",
        ),
        (
            lambda c: c.pop("num_steps_per_env"),
            "rsl_rl config num_steps_per_env: missing (expected an int)",
        ),
        (
            lambda c: c["obs_groups"].update(critic="critic"),
            "rsl_rl config obs_groups.critic: expected a non-empty list of group names, got 'critic'",
        ),
        (lambda c: c.update(actor=[64]), "rsl_rl config actor: expected a dict, got [64]"),
        (
            lambda c: c["algorithm"].update(symmetry_cfg={"data_augmentation_func": 3}),
            "rsl_rl config algorithm.symmetry_cfg.data_augmentation_func: expected a function or "
            "its name, got 3",
        ),
        (
            lambda c: c["algorithm"].update(
                symmetry_cfg={"data_augmentation_func": "m:f", "mirror_loss_coeff": "1"}
            ),
            "rsl_rl config algorithm.symmetry_cfg.mirror_loss_coeff: expected a number, got '1'",
        ),
        (
            lambda c: c["algorithm"].update(rnd_cfg={"learning_rate": None}),
            "rsl_rl config algorithm.rnd_cfg.learning_rate: expected a number, got None",
        ),
        (
            lambda c: c.update(max_iterations=0),
            "rsl_rl config max_iterations: expected an int >= 1 or None, got 0",
        ),
    ],
)
def test_bad_types_are_named(change, message):
    cfg = copy.deepcopy(MJLAB_CARTPOLE)
    change(cfg)
    with pytest.raises(ValueError, match=re.escape(message)):
        from_rsl_rl(cfg)


def test_a_yaml_file_with_python_tuples_and_rsl_rl_defaults(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.dump(ISAACLAB_ANYMAL_D | {"policy": {"actor_hidden_dims": (32, 32)}})
    )  # !!python/tuple
    assert "!!python/tuple" in path.read_text()
    with pytest.warns(RslRlConfigWarning):
        hparams = from_rsl_rl(path).hparams
    # rsl_rl's own defaults for what the policy section leaves out
    assert hparams["model_config"] == {
        "ortho_init": False,
        "hiddens": [32, 32],
        "critic_hiddens": [256, 256, 256],
        "activation": "elu",
        "init_noise_std": 1.0,
        "noise_std_type": "scalar",
    }
    (tmp_path / "bad.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="holds list, not a dict of runner fields"):
        from_rsl_rl(tmp_path / "bad.yaml")
    (tmp_path / "code.yaml").write_text("a: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValueError, match="cannot read"):
        from_rsl_rl(tmp_path / "code.yaml")


def test_the_scalar_std_of_the_carried_config_starts_at_init_noise_std():
    cfg = copy.deepcopy(MJLAB_CARTPOLE)
    cfg["actor"]["distribution_cfg"]["init_std"] = 0.6
    cfg.pop("obs_groups")
    hparams = from_rsl_rl(cfg).hparams
    algo = PPO(Pendulum, num_envs=8, **{**hparams, "horizon": 16, "device": "cpu"})
    assert torch.allclose(algo.policy.model.std, torch.tensor([0.6]))


def mirror_anymal(env=None, obs=None, actions=None):
    """A stand-in for Isaac Lab's ANYmal-D symmetry function on GroupCartPole's groups."""
    if obs is not None:
        obs = torch.cat([obs, obs.apply(lambda x: -x)])
    return obs, None if actions is None else torch.cat([actions, 1 - actions])


def test_symmetry_cfg_maps_to_hparam_symmetry():
    """Isaac Lab's ANYmal-D rough config with its symmetry_cfg (the function itself, as
    dataclasses.asdict leaves it; the name "module:function" in a YAML file)."""
    cfg = copy.deepcopy(ISAACLAB_ANYMAL_D)
    cfg["algorithm"]["symmetry_cfg"] = {
        "use_data_augmentation": True,
        "use_mirror_loss": False,
        "data_augmentation_func": mirror_anymal,
        "mirror_loss_coeff": 0.0,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RslRlConfigWarning)  # device, clip_actions
        hparams, unmapped, _ = from_rsl_rl(cfg)
    assert not any("symmetry" in entry for entry in unmapped)
    assert hparams["symmetry"] == {**cfg["algorithm"]["symmetry_cfg"]}
    algo = PPO(GroupCartPole, **{**hparams, "num_envs": 8, "horizon": 4, "device": "cpu"})
    algo.collect()
    assert algo.update()["losses/symmetry"] >= 0
    cfg["algorithm"]["symmetry_cfg"]["data_augmentation_func"] = (
        "isaaclab_tasks.anymal:compute_symmetric_states"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RslRlConfigWarning)
        hparams = from_rsl_rl(cfg).hparams
    assert (
        hparams["symmetry"]["data_augmentation_func"] == "isaaclab_tasks.anymal.compute_symmetric_states"
    )
    with pytest.raises(
        ValueError, match=r"'isaaclab_tasks.anymal.compute_symmetric_states' is not registered"
    ):
        HParams(symmetry=hparams["symmetry"])


def test_rnd_cfg_maps_to_hparam_rnd_with_the_rnd_state_set_and_step_dt():
    from envs.sim_fakes import PointMassVecEnv

    cfg = copy.deepcopy(MJLAB_CARTPOLE)
    schedule = {"mode": "linear", "initial_step": 0, "final_step": 2000, "final_value": 0.0}
    cfg["algorithm"]["rnd_cfg"] = {  # Isaac Lab's RslRlRndCfg's fields
        "weight": 10.0,
        "weight_schedule": schedule,
        "reward_normalization": True,
        "state_normalization": True,
        "learning_rate": 1e-3,
        "num_outputs": 1,
        "predictor_hidden_dims": (-1,),
        "target_hidden_dims": (-1,),
    }
    cfg["obs_groups"] = {"actor": ["policy"], "critic": ["critic"], "rnd_state": ["critic"]}
    hparams, unmapped, _ = from_rsl_rl(cfg)
    assert unmapped == []
    assert hparams["rnd"] == {
        **cfg["algorithm"]["rnd_cfg"],
        "predictor_hidden_dims": [-1],
        "target_hidden_dims": [-1],
        "state_groups": ["critic"],
        "scale_by_step_dt": True,
    }
    vec_env = PointMassVecEnv(8)
    vec_env.step_dt = 0.02
    algo = PPO(vec_env, **{**hparams, "horizon": 4})
    assert algo.rnd.weight == pytest.approx(10.0 * 0.02) and algo.rnd.groups == ("critic",)
    algo.collect()
    assert algo.update()["losses/rnd"] > 0


DISTILLATION_CFG = {  # rsl_rl 5.5.1's DistillationRunner config, as mjlab and Isaac Lab write it
    "class_name": "DistillationRunner",
    "seed": 3,
    "num_steps_per_env": 16,
    "max_iterations": 2,
    "obs_groups": {"student": ["policy"], "teacher": ["teacher"]},
    "student": {
        "class_name": "MLPModel",
        "hidden_dims": [32, 32],
        "activation": "elu",
        "obs_normalization": True,
        "distribution_cfg": {
            "class_name": "GaussianDistribution",
            "init_std": 0.5,
            "std_type": "scalar",
        },
    },
    "teacher": {
        "class_name": "MLPModel",
        "hidden_dims": [64],
        "activation": "tanh",
        "obs_normalization": False,
    },
    "algorithm": {
        "class_name": "Distillation",
        "num_learning_epochs": 2,
        "gradient_length": 4,
        "learning_rate": 3e-3,
        "max_grad_norm": 1.0,
        "loss_type": "huber",
        "optimizer": "adamw",
    },
    "save_interval": 50,
    "experiment_name": "distill",
}


def test_a_distillation_runner_config_reads_as_distillation_hparams():
    hparams, unmapped, run_args = from_rsl_rl(copy.deepcopy(DISTILLATION_CFG))
    assert unmapped == []
    assert hparams == {
        "horizon": 16,
        "lr": 3e-3,
        "num_sgd_iters": 2,
        "max_grad_norm": 1.0,
        "loss_type": "huber",
        "optimizer_cls": "torch.optim.AdamW",
        "optimizer_kwargs": {},
        "num_minibatches": 4,  # 16 steps in minibatches of gradient_length=4
        "normalize_observations": True,
        "model_config": {
            "ortho_init": False,
            "activation": "elu",
            "hiddens": [32, 32],
            "critic_hiddens": [],
            "init_noise_std": 0.5,
            "noise_std_type": "scalar",
        },
        "seed": 3,
        "obs_groups": {"actor": ["policy"]},
    }
    assert run_args["stop_conditions"][0].bound == 2
    assert rsl_rl_teacher_args(copy.deepcopy(DISTILLATION_CFG)) == {
        "obs_groups": ["teacher"],
        "activation": "tanh",
    }
    teacher = PPO(GoalPoint, num_envs=8, horizon=4, obs_groups={"actor": ["teacher"]}, seed=0).policy
    algo = Distillation(GoalPoint, teacher=teacher, num_envs=8, **hparams)
    Trainer(algo, tracking=False, progress=False).run(**run_args)
    assert algo.steps == 2 and algo.minibatch_size == 8 * 4


def test_a_recurrent_teacher_in_a_distillation_config_is_refused():
    cfg = copy.deepcopy(DISTILLATION_CFG)
    cfg["teacher"]["class_name"] = "rsl_rl.models:RNNModel"
    with pytest.raises(
        ValueError,
        match=r"^rsl_rl config teacher.class_name: expected a feedforward teacher \('MLPModel'\), "
        r"got 'rsl_rl.models:RNNModel'; ",
    ):
        from_rsl_rl(cfg)
    older = copy.deepcopy(DISTILLATION_CFG)
    del older["student"], older["teacher"]
    older["policy"] = {"class_name": "StudentTeacherRecurrent", "teacher_recurrent": True}
    with pytest.raises(
        ValueError,
        match=r"^rsl_rl config policy.teacher_recurrent: expected False \(rl8's Distillation takes a "
        r"feedforward teacher; the student may be recurrent\), got True$",
    ):
        from_rsl_rl(older)
    with pytest.raises(ValueError, match=r"^rsl_rl config policy.teacher_recurrent: expected False"):
        rsl_rl_teacher_args(older)


def test_the_unmapped_warning_points_at_the_caller_of_ppo_and_distillation_configs():
    ppo_cfg, distillation_cfg = copy.deepcopy(MJLAB_CARTPOLE), copy.deepcopy(DISTILLATION_CFG)
    for cfg in (ppo_cfg, distillation_cfg):
        cfg["future_field"] = 3
        with pytest.warns(RslRlConfigWarning, match=r"future_field=3 \(no rl8 counterpart\)") as record:
            from_rsl_rl(cfg)
        assert [w.filename for w in record] == [__file__]


def test_the_older_student_teacher_policy_section_and_a_recurrent_student():
    cfg = copy.deepcopy(DISTILLATION_CFG)
    del cfg["student"], cfg["teacher"]
    cfg["algorithm"]["gradient_length"] = 6  # 16 steps: minibatches of 4, reported
    cfg["policy"] = {
        "class_name": "StudentTeacherRecurrent",
        "student_hidden_dims": [32],
        "teacher_hidden_dims": [64],
        "activation": "elu",
        "init_noise_std": 0.5,
        "rnn_type": "gru",
        "rnn_hidden_dim": 24,
        "rnn_num_layers": 2,
    }
    with pytest.warns(RslRlConfigWarning, match="gradient_length=6"):
        hparams, unmapped, _ = from_rsl_rl(cfg)
    assert hparams["model_cls"] == "rl8.policies.recurrent.GRUModel"
    assert hparams["model_config"] == {
        "ortho_init": False,
        "activation": "elu",
        "hidden_size": 24,
        "num_layers": 2,
        "init_noise_std": 0.5,
    }
    assert (hparams["seq_len"], hparams["num_minibatches"]) == (4, 4)
    assert [u.split(" ")[0] for u in unmapped] == [
        "algorithm.gradient_length=6",
        "policy.hidden_dims=[32]",
        "policy.std_type='scalar'",  # rsl_rl's default; rl8's recurrent models learn the log-std
    ]
    with pytest.raises(
        ValueError, match="expected 'StudentTeacher' or 'StudentTeacherRecurrent' .* got 'ActorCritic'"
    ):
        from_rsl_rl({**cfg, "policy": {"class_name": "ActorCritic"}})
    with pytest.raises(
        ValueError, match="rsl_rl config algorithm.loss_type: expected 'mse' or 'huber', got 'l1'"
    ):
        from_rsl_rl({**cfg, "algorithm": {"loss_type": "l1"}})
