"""First contact, round three (issue 36): rl8 1.x habits meet a hint, not a silent trap."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

import rl8
from rl8.moved import MOVED, NOT_IN_RL8


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_module_path_imports_with_a_warning_naming_the_new_one(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(
        DeprecationWarning, match=rf"{old} is now {MOVED[old][0]}.* see docs/migrating.md"
    ):
        module = importlib.import_module(old)
    new = [importlib.import_module(n) for n in MOVED[old]]
    assert module.__all__, old
    for name in module.__all__:  # every public name of the new modules, the same object
        assert any(getattr(module, name) is getattr(n, name, None) for n in new), (old, name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        module.nope
    monkeypatch.delitem(sys.modules, old)


@pytest.mark.parametrize("name", sorted(NOT_IN_RL8))
def test_names_rl8_has_not_are_import_and_attribute_errors_saying_what_to_use(name):
    pointer = f": {NOT_IN_RL8[name]} (docs/migrating.md)"
    with pytest.raises(ImportError) as error:
        exec(f"from rl8 import {name}", {})
    assert str(error.value) == f"cannot import name {name!r} from 'rl8'{pointer}"
    with pytest.raises(AttributeError) as error:
        getattr(rl8, name)
    assert str(error.value) == f"module 'rl8' has no attribute {name!r}{pointer}"
    assert not hasattr(rl8, name)


@pytest.mark.parametrize(
    "name, pointer",
    [
        (
            "evaluate_policy",
            "Stable-Baselines3's evaluate_policy(model, env) is, in rl8, Trainer(algo).eval()",
        ),
        (
            "evaluate_policy",
            "algo.evaluate() (the same stats, not logged) or the command `rl8 eval RUN_ID_OR_FILE",
        ),
        ("make_vec_env", "make_vec_env('CartPole-v1', n_envs=4) is rl8.PPO('CartPole-v1', num_envs=4)"),
        ("Algorithm", "rl8 1.0's Algorithm(env_cls, **config) is rl8.PPO(env, **hparams)"),
        (
            "TrainConfig",
            "rl8 1.0's TrainConfig.from_file(path).build().run() is the command `rl8 train path.yaml`",
        ),
    ],
)
def test_the_names_of_the_issue_point_to_rl8s_way(name, pointer):
    with pytest.raises(ImportError, match=re.escape(pointer)):
        exec(f"from rl8 import {name}", {})


def test_other_names_rl8_has_not_keep_pythons_errors():
    with pytest.raises(ImportError, match=r"^cannot import name 'Nope' from 'rl8' \("):
        from rl8 import Nope  # noqa: F401
    with pytest.raises(AttributeError, match=r"^module 'rl8' has no attribute 'Nope'$"):
        rl8.Nope


def test_rl8_1_0_0s_paths_import_their_classes(monkeypatch):
    for old in ("rl8.conditions", "rl8.trainers", "rl8.env"):
        monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match="rl8.training.conditions"):
        from rl8.conditions import HitsUpperBound
    with pytest.warns(DeprecationWarning, match="rl8.training.trainer and rl8.training.config"):
        from rl8.trainers import Trainer
    with pytest.warns(DeprecationWarning, match="rl8.envs.base and rl8.envs.dummy"):
        from rl8.env import DiscreteDummyEnv, Env
    from rl8 import Env as new_env
    from rl8.envs import DiscreteDummyEnv as new_dummy
    from rl8.training.conditions import HitsUpperBound as new_bound
    from rl8.training.trainer import Trainer as new_trainer

    assert (HitsUpperBound, Trainer, Env, DiscreteDummyEnv) == (
        new_bound,
        new_trainer,
        new_env,
        new_dummy,
    )


def test_a_1_0_0_name_rl8_has_not_says_what_to_use_through_its_old_module(monkeypatch):
    monkeypatch.delitem(sys.modules, "rl8.algorithms", raising=False)
    with pytest.warns(DeprecationWarning, match="rl8.ppo.algorithm"):
        algorithms = importlib.import_module("rl8.algorithms")
    with pytest.raises(AttributeError, match=re.escape(f"'Algorithm': {NOT_IN_RL8['Algorithm']}")):
        algorithms.Algorithm


@pytest.mark.parametrize(
    "path", ["rl8.overlap", "rl8.actors", "rl8.finite", "rl8.rollout", "rl8.checkpoint"]
)
def test_the_paths_of_unreleased_layouts_are_gone(path):
    with pytest.raises(ModuleNotFoundError, match=f"No module named '{path}'"):
        importlib.import_module(path)


SMALL = dict(num_envs=4, horizon=8, sgd_minibatch_size=16, num_sgd_iters=1, seed=0)


def _trainer():
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole

    return Trainer(PPO(CartPole, **SMALL), tracking=False, progress=False)


def test_learn_trains_that_many_more_env_steps_at_each_call():
    with _trainer() as trainer:
        trainer.learn(64)
        trainer.learn(64)
        assert trainer.algo.env_steps == 128
        with pytest.raises(ValueError, match="Trainer.learn: env_steps must be an int >= 1"):
            trainer.learn(0)


def test_a_callback_stops_the_run_on_rl8_stop_only_and_a_bare_bool_warns():
    import numpy as np

    import rl8
    from rl8.training.callbacks import Callback

    class SB3Habit(Callback):
        def on_step(self, trainer, stats):
            return True  # SB3: "go on"

    with _trainer() as trainer:
        with pytest.warns(UserWarning, match=r"returned True, which rl8 ignores: return rl8.STOP"):
            trainer.run(max_env_steps=96, callbacks=[SB3Habit(), lambda trainer, stats: np.bool_(False)])
        assert trainer.algo.env_steps == 96
        assert rl8.STOP == "stop"
        trainer.run(max_env_steps=10**6, callbacks=lambda trainer, stats: rl8.STOP)
        assert trainer.algo.env_steps == 128


def test_sb3s_ppo_signature_gets_a_hint():
    from rl8 import PPO

    with pytest.raises(
        TypeError,
        match=r"PPO\('MlpPolicy', 'CartPole-v1'\)\. Stable-Baselines3's .* is rl8's PPO\(env\)",
    ):
        PPO("MlpPolicy", "CartPole-v1")


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
    from rl8 import PPO
    from rl8.envs import CartPole

    algo = PPO(CartPole, **SMALL, optimizer_cls=optimizer)
    assert algo.optimizer.defaults.get("eps") == eps
    assert algo.hparams.optimizer_kwargs == ({} if eps != 1e-5 else {"eps": 1e-5})
    with pytest.raises(ValueError, match="SGD refused"):  # given explicitly: still checked
        PPO(CartPole, **SMALL, optimizer_cls="torch.optim.SGD", optimizer_kwargs={"eps": 1e-5})


@pytest.mark.slow
def test_the_console_script_with_trust_code_imports_a_module_of_the_working_folder(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    from rl8 import Policy, save_policy
    from rl8.envs import CartPole

    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    (work / "mycartpole.py").write_text(
        "from rl8.envs import CartPole\n\nclass MyCartPole(CartPole):\n    pass\n"
    )
    env = CartPole(1)
    save_policy(
        Policy(env.observation_space, env.action_space),
        work / "policy.pt",
        env={"spec": "mycartpole.MyCartPole", "env_kwargs": {}, "env_config": {}},
    )
    # a script outside the working folder, as the installed `rl8` console script is
    (bin_dir / "rl8").write_text("import sys\nfrom rl8.cli import main\nsys.exit(main())\n")
    root = str(Path(__file__).resolve().parent.parent)
    run = [
        sys.executable,
        str(bin_dir / "rl8"),
        "eval",
        "policy.pt",
        "--episodes",
        "1",
        "--max-steps",
        "5",
    ]
    env_vars = {**os.environ, "PYTHONPATH": root}
    refused = subprocess.run(run, cwd=work, env=env_vars, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "(rl8 --trust-code) imports it" in refused.stderr, refused.stderr
    trusted = subprocess.run(
        [*run, "--trust-code"], cwd=work, env=env_vars, capture_output=True, text=True, timeout=120
    )
    assert trusted.returncode == 0 and "within 5 steps" in trusted.stdout, trusted.stderr


@pytest.mark.parametrize(
    "build",
    [
        lambda c: c.Plateaus("returns/mean", patience=3, rtol=0.1),
        lambda c: c.StopsIncreasing("returns/mean", patience=3),
        lambda c: c.StopsDecreasing("eval/returns/mean", patience=3),
        lambda c: c.HitsUpperBound("returns/mean", 1.0),
    ],
)
def test_an_old_stat_name_warns_at_the_users_line(build):
    import warnings

    from rl8.training import conditions

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(conditions)
    assert [w.filename for w in caught if issubclass(w.category, DeprecationWarning)] == [__file__]


def test_rl8_1_command_lines_and_configs_get_hints(tmp_path, capsys):
    from rl8.cli import main

    (tmp_path / "old.yaml").write_text("env_cls: rl8.envs.CartPole\nalgorithm_config:\n  horizon: 8\n")
    assert main(["train", "-f", "old.yaml"]) == 2
    assert (
        "rl8 train takes the config file as its argument: rl8 train old.yaml" in capsys.readouterr().err
    )
    assert main(["train", "old.yaml"]) == 2
    assert "rl8 1.0's env_cls is now env (see docs/migrating.md)" in capsys.readouterr().err
    (tmp_path / "old.yaml").write_text("env: rl8.envs.CartPole\nalgorithm_config:\n  horizon: 8\n")
    assert main(["train", "old.yaml"]) == 2
    assert "rl8 1.0's algorithm_config is now hparams" in capsys.readouterr().err
    args = [
        "train",
        "--env",
        "rl8.envs.CartPole",
        "--set",
        "num_envs=4",
        "--set",
        "horizon=8",
        "--max-steps",
        "10",
        "--tracking-uri",
        str(tmp_path / "mlruns-off"),
        "--quiet",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    main(args)
    assert (
        "max_steps counts env steps (rl8 1.0: training steps); 10 is less than one training step (32"
        in (capsys.readouterr().err)
    )


def test_an_old_mlruns_folder_is_explained_before_training(tmp_path, monkeypatch):
    import mlflow

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.tracking import TrackingError

    (tmp_path / "mlruns" / "0").mkdir(parents=True)
    (tmp_path / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")  # an rl8 1.0-era store
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(None)  # MLflow's own default: it picks ./mlruns
    algo = PPO(CartPole, **SMALL)
    with pytest.raises(
        TrackingError,
        match=r"MLflow picked the folder store .*mlruns.* over the default "
        r"sqlite:///mlflow.db .*mlflow migrate-filestore",
    ):
        Trainer(algo, progress=False).run(max_env_steps=1)  # the run starts before training
    assert algo.env_steps == 0
    with pytest.raises(TrackingError, match="is a folder store, and MLflow 3 refuses folder stores"):
        Trainer(algo, progress=False, tracking_uri=str(tmp_path / "runs")).step()
    assert algo.env_steps == 0


def test_creating_the_default_store_leaves_no_lock_file_in_the_users_folder(tmp_path):
    from rl8.tracking.store import ready_store

    ready_store(f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}")
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["mlflow.db"]


def test_an_env_config_mistake_is_an_error_before_training(tmp_path, migrated_store, capsys):
    from rl8 import PPO, Trainer
    from rl8.cli import main
    from rl8.envs import CartPole

    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        with pytest.raises(ValueError, match="Trainer.run: env_config: .*'nope'"):
            trainer.run(max_env_steps=64, env_config={"nope": 1})
        assert trainer.algo.env_steps == 0
        trainer.run(max_env_steps=32)
    assert main(["train", "--resume", str(tmp_path / "ck"), "--max-steps", "64", "--quiet"]) == 0
    capsys.readouterr()
    (tmp_path / "run.yaml").write_text("env_config:\n  nope: 1\n")
    code = main(["train", "run.yaml", "--resume", str(tmp_path / "ck"), "--max-steps", "128"])
    err = capsys.readouterr().err
    assert code == 2 and "rl8: error: env_config: CartPole.reset: unknown config key 'nope'" in err, err


@pytest.mark.slow
def test_a_model_stored_as_main_net_is_handed_over_with_model_cls(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "mynet.py").write_text(
        "from rl8.policies.models import MLPModel\n\nclass Net(MLPModel):\n    pass\n"
    )
    (tmp_path / "script.py").write_text(
        "from rl8 import PPO, Trainer, save_policy\nfrom rl8.envs import CartPole\nfrom rl8.policies.models import MLPModel\n"
        "class Net(MLPModel):\n    pass\n"
        "with Trainer(PPO(CartPole, num_envs=4, horizon=8, sgd_minibatch_size=16, model_cls=Net), tracking=False,"
        " progress=False, checkpoint_dir='ck') as t:\n    t.run(max_env_steps=32)\n"
        "    save_policy(t.algo.policy, 'p.pt', env={'spec': 'rl8.envs.cartpole.CartPole', 'env_kwargs': {}, 'env_config': {}})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    def rl8(*args):
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    assert rl8("script.py").returncode == 0
    refused = rl8("-m", "rl8", "eval", "p.pt", "--episodes", "1")
    assert refused.returncode == 2 and "--model-cls mymodule.Net" in refused.stderr, refused.stderr
    evaluated = rl8("-m", "rl8", "eval", "p.pt", "--episodes", "1", "--model-cls", "mynet.Net")
    assert evaluated.returncode == 0 and "mean return over 1 episodes" in evaluated.stdout, (
        evaluated.stderr
    )
    resumed = rl8(
        "-m",
        "rl8",
        "train",
        "--resume",
        "ck",
        "--max-steps",
        "64",
        "--quiet",
        "--model-cls",
        "mynet.Net",
    )
    assert resumed.returncode == 0 and "checkpoint-000000000064.pt" in resumed.stdout, resumed.stderr
