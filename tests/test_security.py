"""Loading a file never runs code: names in checkpoints and policy files are looked up in the
registry of the running process (never imported) and checked for their kind before anything is
called (docs/security.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import gymnasium
import pytest
import torch
from hparams import SMALL

import rl8.registry
from rl8 import PPO, Trainer, load_policy, save_policy
from rl8.cli import main
from rl8.envs import CartPole
from rl8.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rl8.policies.models import MLPModel


class MyCartPole(CartPole):
    """A user's own Env subclass: a checkpoint naming it must keep loading."""


class MyModel(MLPModel):
    """A user's own Model subclass."""


def make_gym_cartpole(**kwargs):
    """A user's env factory function (needs trust_code to be called from a file)."""
    return gymnasium.make("CartPole-v1", **kwargs)


@pytest.fixture
def checkpoint(tmp_path):
    """A real Trainer checkpoint of a small CartPole run (no tracking)."""
    with Trainer(PPO(CartPole, **SMALL), tracking=False, checkpoint_dir=tmp_path / "ckpt") as trainer:
        return trainer.save_checkpoint()


def shell_payload(marker):
    """env_kwargs under which an env factory ``subprocess.run`` would run ``touch marker``."""
    return {"env_kwargs": {"args": f"touch {marker}", "shell": True}}


def craft_checkpoint(path, out, *, env=None, env_kwargs=None, **hparams):
    state = load_checkpoint(path)
    if env is not None:
        state["env"]["spec"] = env
        state["trainer"]["policy"]["env"]["spec"] = env
    if env_kwargs is not None:
        state["algo"]["hparams"]["env_kwargs"] = env_kwargs
        state["trainer"]["policy"]["env"]["env_kwargs"] = env_kwargs
    state["algo"]["hparams"].update(hparams)
    for key in ("model_cls", "distribution_cls"):
        if key in hparams:
            state["trainer"]["policy"][key] = hparams[key]
    return save_checkpoint(state, out)


def craft_policy(tmp_path, *, env=None, env_kwargs=None, **entries):
    path = tmp_path / "policy.pt"
    save_policy(
        PPO(CartPole, **SMALL).policy,
        path,
        env={
            "spec": env or "rl8.envs.cartpole.CartPole",
            "env_kwargs": env_kwargs or {},
            "env_config": {},
        },
    )
    state = load_checkpoint(path)
    state.update(entries)
    return save_checkpoint(state, path)


# ------------------------------------------------------------------- the shell-command attack


def test_a_crafted_env_spec_does_not_run_through_from_checkpoint(checkpoint, tmp_path):
    marker = tmp_path / "pwned"
    evil = craft_checkpoint(
        checkpoint, tmp_path / "evil.pt", env="subprocess.run", env_kwargs=shell_payload(marker)
    )
    with pytest.raises(
        CheckpointError, match=r"subprocess\.run.*not registered.*refused to import it"
    ) as info:
        Trainer.from_checkpoint(evil, tracking=False)
    assert "evil.pt" in str(info.value) and "trust_code" in str(info.value)
    assert not marker.exists()


def test_a_crafted_env_spec_does_not_run_through_rl8_train_resume(checkpoint, tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = craft_checkpoint(
        checkpoint, tmp_path / "evil.pt", env="subprocess.run", env_kwargs=shell_payload(marker)
    )
    assert main(["train", "--resume", str(evil), "--max-steps", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'subprocess.run'" in err and "not registered" in err
    assert not marker.exists()


def test_a_crafted_env_spec_does_not_run_through_rl8_eval(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = craft_policy(tmp_path, env="subprocess.run", env_kwargs=shell_payload(marker))
    assert main(["eval", str(evil), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "'subprocess.run'" in err and "not registered" in err
    assert not marker.exists()


def test_a_crafted_env_spec_does_not_run_through_rl8_record(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = craft_policy(tmp_path, env="subprocess.run", env_kwargs=shell_payload(marker))
    assert main(["record", str(evil), "-o", str(tmp_path / "v.mp4")]) == 2
    assert "not registered" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize(
    "key, name",
    [
        ("model_cls", "os.system"),
        ("model_cls", "builtins.eval"),
        ("distribution_cls", "builtins.exec"),
        ("distribution_cls", "subprocess.Popen"),
        ("optimizer_cls", "subprocess.run"),
        ("optimizer_cls", "os.system"),
    ],
)
def test_crafted_class_paths_in_a_checkpoint_are_refused(checkpoint, tmp_path, key, name):
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", **{key: name})
    with pytest.raises(
        CheckpointError, match=rf"{key} = '{name}'.*not registered.*refused to import it"
    ):
        Trainer.from_checkpoint(evil, tracking=False)


@pytest.mark.parametrize(
    "key, name",
    [
        ("model_cls", "rl8.envs.CartPole"),  # registered, but an env
        ("distribution_cls", "torch.nn.Linear"),  # registered, but a torch module
        ("optimizer_cls", "rl8.policies.models.MLPModel"),
        ("model_cls", f"{__name__}.make_gym_cartpole"),  # registered below, but a function
    ],
)
def test_registered_names_of_the_wrong_kind_are_refused(checkpoint, tmp_path, monkeypatch, key, name):
    monkeypatch.setattr(rl8.registry, "_USER", {})
    rl8.register(make_gym_cartpole)
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", **{key: name})
    with pytest.raises(CheckpointError, match=rf"{key} = '{name}'.*wrong kind.*refused to call it"):
        Trainer.from_checkpoint(evil, tracking=False)
    if key != "optimizer_cls":  # a policy holds no optimizer
        with pytest.raises(CheckpointError, match="wrong kind"):
            load_policy(evil)


@pytest.mark.parametrize(
    "key, name",
    [
        ("model_cls", "os.system"),
        ("model_cls", "builtins.eval"),
        ("distribution_cls", "builtins.exec"),
    ],
)
def test_crafted_class_paths_in_a_policy_file_are_refused(tmp_path, key, name):
    evil = craft_policy(tmp_path, **{key: name})
    with pytest.raises(
        CheckpointError, match=rf"{key} = '{name}'.*not registered.*refused to import it"
    ):
        load_policy(evil)


@pytest.mark.parametrize(
    "name, words",
    [
        ("subprocess.run", "not registered"),
        (
            "torch.optim.Adam",
            r"torch\.optim\.Adam', which is the class .*, not a torch.nn.Module subclass",
        ),
    ],
)
def test_a_crafted_class_in_the_model_config_is_refused(tmp_path, name, words):
    marker = tmp_path / "pwned"
    evil = craft_policy(
        tmp_path, model_config={"activation": {"__class__": name}, "hiddens": [f"touch {marker}"]}
    )
    with pytest.raises(CheckpointError, match=rf"model_config\['activation'\] = .*{words}"):
        load_policy(evil)
    assert not marker.exists()


def test_a_crafted_trainer_checkpoint_is_refused_by_load_policy(checkpoint, tmp_path):
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", model_cls="os.system")
    with pytest.raises(CheckpointError, match="'os.system'.*not registered"):
        load_policy(evil)


@pytest.mark.parametrize(
    "spec",
    [
        "antigravity.Env",  # opens a web browser when imported
        "test.Env",  # the package of test.autotest (runs CPython's tests)
        "rl8.__main__.main",  # would run the rl8 command
        "os._exit",
    ],
)
def test_file_paths_that_importing_could_abuse_are_refused_before_import(checkpoint, tmp_path, spec):
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", env=spec)
    with pytest.raises(
        CheckpointError, match=rf"'{spec}', which is not registered.*refused to import it"
    ):
        Trainer.from_checkpoint(evil, tracking=False)
    assert not {"antigravity", "test", "rl8.__main__"} & set(sys.modules)


def test_a_gymnasium_id_that_imports_a_module_is_checked_as_a_path(checkpoint, tmp_path):
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", env="antigravity:Fly-v0")
    with pytest.raises(
        CheckpointError, match="makes gymnasium import the module 'antigravity'; rl8 refused"
    ):
        Trainer.from_checkpoint(evil, tracking=False)
    assert "antigravity" not in sys.modules


def test_a_gymnasium_env_class_cannot_smuggle_an_importing_id(checkpoint, tmp_path):
    evil = craft_checkpoint(
        checkpoint,
        tmp_path / "evil.pt",
        env="rl8.envs.gymnasium.GymnasiumEnv",
        env_kwargs={"env": "antigravity:Fly-v0"},
    )
    with pytest.raises(CheckpointError, match=r"env_kwargs\['env'\].*antigravity"):
        Trainer.from_checkpoint(evil, tracking=False)
    assert "antigravity" not in sys.modules


@pytest.mark.parametrize("env_kwargs", [["env", "CartPole-v1"], "CartPole-v1"])
def test_stored_env_kwargs_that_are_not_a_dict_are_refused(checkpoint, tmp_path, env_kwargs):
    evil = craft_checkpoint(
        checkpoint, tmp_path / "evil.pt", env="rl8.envs.gymnasium.GymnasiumEnv", env_kwargs=env_kwargs
    )
    with pytest.raises(
        CheckpointError,
        match=rf"evil.pt: env env_kwargs must be a dict, got "
        rf"{type(env_kwargs).__name__}",
    ):
        Trainer.from_checkpoint(evil, tracking=False)


@pytest.fixture
def script_in_working_dir(tmp_path, monkeypatch):
    """A module in the current directory (first on sys.path, as under ``python -m rl8``) whose
    import touches a marker file: a stand-in for a setup.py or a script without a main guard."""
    folder = tmp_path / "project"
    folder.mkdir()
    marker = tmp_path / "imported"
    (folder / "local_script.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nEnv = 42\n"
    )
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "local_script", raising=False)
    return marker


@pytest.mark.parametrize(
    "spec, env_kwargs",
    [
        ("local_script.Env", None),
        ("local_script:Env-v0", None),
        ("rl8.envs.gymnasium.GymnasiumEnv", {"env": "local_script:Env-v0"}),
    ],
)
def test_a_file_cannot_import_a_module_of_the_current_directory(
    checkpoint, tmp_path, script_in_working_dir, spec, env_kwargs
):
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", env=spec, env_kwargs=env_kwargs)
    with pytest.raises(CheckpointError, match=r"'local_script.*refused to import it.*trust_code"):
        Trainer.from_checkpoint(evil, tracking=False)
    assert not script_in_working_dir.exists() and "local_script" not in sys.modules


@pytest.mark.parametrize("command", ["eval", "record"])
def test_env_names_inside_the_stored_env_kwargs_are_checked_when_env_is_given(
    tmp_path, script_in_working_dir, capsys, command
):
    policy = craft_policy(
        tmp_path, env="rl8.envs.gymnasium.GymnasiumEnv", env_kwargs={"env": "local_script:Env-v0"}
    )
    argv = [
        command,
        str(policy),
        "--env",
        "rl8.envs.GymnasiumEnv",
        "--max-steps",
        "2",
        *(["-o", str(tmp_path / "v.mp4")] if command == "record" else []),
    ]
    assert main(argv) == 2
    assert "env env_kwargs['env'] = 'local_script:Env-v0'" in capsys.readouterr().err
    assert not script_in_working_dir.exists()


def test_trust_code_imports_a_module_of_the_current_directory(
    checkpoint, tmp_path, script_in_working_dir
):
    evil = craft_checkpoint(checkpoint, tmp_path / "evil.pt", env="local_script.Env")
    with pytest.raises(CheckpointError, match="wrong kind"):  # imported, then refused for its kind
        Trainer.from_checkpoint(evil, tracking=False, trust_code=True)
    assert script_in_working_dir.exists()


# ------------------------------------------------------------------- names are never imported


@pytest.fixture
def namespace_trap(tmp_path, monkeypatch):
    """A working folder holding ``google/rl8poc.py`` and ``opentelemetry/rl8poc.py``, which
    write a marker file when imported. After ``import mlflow`` the namespace packages ``google``
    and ``opentelemetry`` are imported, and with the working folder on ``sys.path`` (as under
    ``python -m rl8``) their ``__path__`` holds its folders: ``import google.rl8poc`` would run
    the file. Yields the folder and the marker."""
    import mlflow  # noqa: F401

    work, marker = tmp_path / "work", tmp_path / "PWNED"
    for package in ("google", "opentelemetry"):
        (work / package).mkdir(parents=True)
        (work / package / "rl8poc.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        )
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    for package in ("google", "opentelemetry"):  # the trap is armed: importing the name would run it
        assert str(work / package) in list(sys.modules[package].__path__)
    yield work, marker
    for package in ("google", "opentelemetry"):
        sys.modules.pop(f"{package}.rl8poc", None)


def assert_not_imported(marker):
    assert not {"google.rl8poc", "opentelemetry.rl8poc"} & set(sys.modules)
    assert not marker.exists()


@pytest.mark.parametrize(
    "key, name", [("model_cls", "google.rl8poc.Model"), ("env", "opentelemetry.rl8poc.Env")]
)
def test_a_namespace_package_cannot_import_a_file_of_the_working_folder(
    checkpoint, namespace_trap, key, name
):
    work, marker = namespace_trap
    evil = craft_checkpoint(checkpoint, work / "evil.pt", **{key: name})
    with pytest.raises(
        CheckpointError, match=rf"'{name}', which is not registered.*refused to import it"
    ):
        Trainer.from_checkpoint(evil, tracking=False)
    assert_not_imported(marker)
    if key == "model_cls":
        with pytest.raises(CheckpointError, match=rf"model_cls = '{name}', which is not registered"):
            load_policy(evil)
    else:
        assert main(["eval", str(evil), "--episodes", "1"]) == 2
    assert_not_imported(marker)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["eval", "evil.pt", "--episodes", "1"],
        ["train", "--resume", "evil.pt", "--max-steps", "1", "--quiet"],
    ],
)
def test_a_namespace_package_cannot_import_a_file_of_the_working_folder_via_python_m_rl8(
    checkpoint, namespace_trap, command
):
    work, marker = namespace_trap
    craft_checkpoint(checkpoint, work / "evil.pt", model_cls="google.rl8poc.Model")
    # python -m rl8 after mlflow is imported (rl8 eval RUN_ID imports it to download the file)
    code = (
        "import mlflow, runpy, sys; sys.argv = ['rl8', *sys.argv[1:]]; "
        "runpy.run_module('rl8', run_name='__main__', alter_sys=True)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *command], cwd=work, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert "'google.rl8poc.Model', which is not registered" in done.stderr
    assert not marker.exists()


def test_a_file_naming_an_unregistered_class_does_not_import_its_module(
    checkpoint, tmp_path, monkeypatch
):
    folder, marker = tmp_path / "lib", tmp_path / "imported"
    folder.mkdir()
    (folder / "rl8_far_envs.py").write_text(
        textwrap.dedent(f"""
        import pathlib

        from rl8.envs import CartPole

        pathlib.Path({str(marker)!r}).touch()


        class Far(CartPole):
            \"\"\"An env of a module that the loading process has not imported.\"\"\"
    """)
    )
    monkeypatch.syspath_prepend(str(folder))
    evil = craft_checkpoint(checkpoint, tmp_path / "far.pt", env="rl8_far_envs.Far")
    assert "rl8_far_envs" not in sys.modules
    with pytest.raises(
        CheckpointError,
        match=r"env = 'rl8_far_envs.Far', which is not registered in this "
        r"process; rl8 refused to import it.*Import rl8_far_envs before",
    ):
        Trainer.from_checkpoint(evil, tracking=False)
    assert "rl8_far_envs" not in sys.modules and not marker.exists()
    try:
        importlib.import_module("rl8_far_envs")  # importing it registers its Env subclass: it loads
        # a copy of the run's checkpoint, resumed into a folder of its own (the run's holds the original)
        resumed = Trainer.from_checkpoint(evil, tracking=False, checkpoint_dir=tmp_path / "resumed")
        assert type(resumed.algo.env).__qualname__ == "Far"
        resumed.close()
    finally:
        sys.modules.pop("rl8_far_envs", None)


# ------------------------------------------------------------------- legitimate files still load


def test_a_checkpoint_of_a_custom_env_and_model_loads(tmp_path):
    algo = PPO(MyCartPole, model_cls=MyModel, optimizer_cls=torch.optim.AdamW, **SMALL)
    with Trainer(algo, tracking=False, checkpoint_dir=tmp_path) as trainer:
        trainer.step()
        path = trainer.save_checkpoint()
    state = load_checkpoint(path)
    assert state["env"]["spec"] == f"{__name__}.MyCartPole"
    assert state["algo"]["hparams"]["model_cls"] == f"{__name__}.MyModel"
    resumed = Trainer.from_checkpoint(path, tracking=False)
    assert type(resumed.algo.env) is MyCartPole and type(resumed.algo.policy.model) is MyModel
    assert type(resumed.algo.optimizer) is torch.optim.AdamW
    for name, value in algo.policy.state_dict().items():
        assert torch.equal(resumed.algo.policy.state_dict()[name], value)
    resumed.close()
    policy = load_policy(path)
    assert type(policy.model) is MyModel


@pytest.mark.parametrize("spec", ["CartPole-v1", "rl8.envs.CartPole", "rl8.envs.gymnasium.GymnasiumEnv"])
def test_the_stored_forms_of_builtin_envs_load(tmp_path, spec):
    kwargs = {"env": "CartPole-v1"} if spec.endswith("GymnasiumEnv") else {}
    with Trainer(
        PPO(spec, env_kwargs=kwargs, **SMALL), tracking=False, checkpoint_dir=tmp_path
    ) as trainer:
        path = trainer.save_checkpoint()
        saved_env, saved_weights = type(trainer.algo.env), trainer.algo.policy.state_dict()
    with Trainer.from_checkpoint(path, tracking=False) as resumed:
        assert type(resumed.algo.env) is saved_env
        weights = resumed.algo.policy.state_dict()
        assert all(torch.equal(weights[name], value) for name, value in saved_weights.items())
        resumed.step()  # the env built from its stored form trains


def test_an_env_factory_function_needs_registering_or_trust_code(tmp_path, capsys, monkeypatch):
    with Trainer(PPO(make_gym_cartpole, **SMALL), tracking=False, checkpoint_dir=tmp_path) as trainer:
        path = trainer.save_checkpoint()
    assert load_checkpoint(path)["env"]["spec"] == f"{__name__}.make_gym_cartpole"
    with pytest.raises(
        CheckpointError, match=r"not registered.*rl8.register\(make_gym_cartpole\).*trust_code=True"
    ):
        Trainer.from_checkpoint(path, tracking=False)
    resumed = Trainer.from_checkpoint(path, tracking=False, trust_code=True)
    assert resumed.algo.env.env is make_gym_cartpole
    resumed.close()
    assert main(["eval", str(path), "--episodes", "1", "--max-steps", "5"]) == 2
    assert "--trust-code" in capsys.readouterr().err
    assert main(["eval", str(path), "--episodes", "1", "--max-steps", "5", "--trust-code"]) == 0
    monkeypatch.setattr(rl8.registry, "_USER", {})
    rl8.register(make_gym_cartpole)  # you vouch for it: it loads without trust_code
    resumed = Trainer.from_checkpoint(path, tracking=False)
    assert resumed.algo.env.env is make_gym_cartpole
    resumed.close()


# ------------------------------------------------------------------- names given in code


@pytest.mark.parametrize(
    "key, value, expected",
    [
        (
            "model_cls",
            "os.system",
            r"hparam model_cls: expected an rl8 Model subclass \(rl8.policies.models.Model\) or its dotted path, got 'os.system'",
        ),
        (
            "distribution_cls",
            torch.nn.Linear,
            r"hparam distribution_cls: expected an rl8 Distribution subclass \(rl8.policies.distributions.Distribution\) or its "
            r"dotted path, got .*Linear",
        ),
        (
            "optimizer_cls",
            "builtins.eval",
            r"hparam optimizer_cls: expected a torch.optim.Optimizer subclass or its dotted path, got 'builtins.eval'",
        ),
    ],
)
def test_class_hparams_given_in_code_are_checked_for_their_kind(key, value, expected):
    # one check and one message: objects when the hparams are made, dotted paths when PPO imports them
    with pytest.raises(ValueError, match=expected):
        PPO(CartPole, **{key: value}, **SMALL)


def test_a_missing_dependency_of_a_named_module_is_reported_as_such(tmp_path, monkeypatch):
    (tmp_path / "needs_missing_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        PPO("needs_missing_dep.Env", **SMALL)
