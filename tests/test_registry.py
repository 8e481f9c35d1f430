"""rl8.registry: what files may name, registering, handing classes over at load time, and the
names you give on the rl8 command line (docs/security.md, docs/envs.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
import torch
from hparams import SMALL

import rl8
from rl8 import PPO, Policy, Trainer, load_policy, registry, save_policy
from rl8.cli import main
from rl8.envs import CartPole
from rl8.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rl8.policies.distributions import Normal
from rl8.policies.models import MLPModel
from rl8.registry import lookup


@pytest.fixture(autouse=True)
def own_registrations(monkeypatch):
    """Each test starts without user registrations and leaves none behind."""
    monkeypatch.setattr(registry, "_USER", {})


def make_cartpole(**kwargs):
    """A user's env factory function."""
    return gymnasium.make("CartPole-v1", **kwargs)


def make_other(**kwargs):
    """Another function."""
    return gymnasium.make("CartPole-v1", **kwargs)


class Reach(CartPole):
    """A user's env (an rl8.Env subclass registers itself)."""


class Net(MLPModel):
    """A user's model (a Model subclass registers itself)."""


def test_rl8_and_torch_classes_are_found_under_their_defining_and_public_paths():
    assert (
        registry.lookup("rl8.envs.CartPole") is CartPole is registry.lookup("rl8.envs.cartpole.CartPole")
    )
    assert registry.lookup("rl8.MLPModel") is MLPModel is registry.lookup("rl8.policies.models.MLPModel")
    assert registry.lookup("rl8.policies.distributions.Normal") is Normal
    assert (
        registry.lookup("torch.optim.Adam")
        is torch.optim.Adam
        is registry.lookup("torch.optim.adam.Adam")
    )
    assert (
        registry.lookup("torch.nn.Tanh")
        is torch.nn.Tanh
        is registry.lookup("torch.nn.modules.activation.Tanh")
    )
    assert registry.lookup(f"{__name__}.Reach") is Reach and registry.lookup(f"{__name__}.Net") is Net
    # not classes that files may name: a function nobody registered, rl8's command, os.system
    for name in (
        f"{__name__}.make_cartpole",
        "rl8.__main__.main",
        "rl8.cli.main",
        "os.system",
        "not a name",
    ):
        assert registry.lookup(name) is None
    assert "rl8.__main__" not in sys.modules


def test_register_returns_its_object_and_takes_extra_names():
    assert rl8.register(make_cartpole) is make_cartpole
    assert registry.lookup(f"{__name__}.make_cartpole") is make_cartpole
    # the decorator form with a name, e.g. the path of a module the function was moved from
    assert rl8.register(name="old_project.envs.make_env")(make_cartpole) is make_cartpole
    assert registry.lookup("old_project.envs.make_env") is make_cartpole
    with pytest.raises(
        ValueError,
        match=rf"'old_project.envs.make_env' is registered already for "
        rf"{__name__}.make_cartpole; choose another name",
    ):
        rl8.register(make_other, name="old_project.envs.make_env")
    with pytest.raises(ValueError, match="name must be a dotted path of Python names.*got 'not a path'"):
        rl8.register(make_other, name="not a path")
    with pytest.raises(TypeError, match="a lambda or a local object"):
        rl8.register(lambda: None)


def test_a_class_defined_again_replaces_the_one_registered():
    first = type("Twin", (torch.optim.SGD,), {"__module__": __name__})
    second = type("Twin", (torch.optim.SGD,), {"__module__": __name__})
    rl8.register(first, name="old_project.Twin")
    rl8.register(second, name="old_project.Twin")  # a notebook cell run again
    assert registry.lookup("old_project.Twin") is second


@pytest.fixture
def notebook_checkpoint(tmp_path):
    """A checkpoint as a notebook writes it: its env and model classes live in ``__main__``,
    which this process does not define."""
    with Trainer(
        PPO(Reach, model_cls=Net, **SMALL), tracking=False, checkpoint_dir=tmp_path / "ck"
    ) as trainer:
        path = trainer.save_checkpoint()
    state = load_checkpoint(path)
    state["env"]["spec"] = state["trainer"]["policy"]["env"]["spec"] = "__main__.Reach"
    state["algo"]["hparams"]["model_cls"] = state["trainer"]["policy"]["model_cls"] = "__main__.Net"
    return save_checkpoint(state, path)  # in place: the run's own folder holds it


def test_a_class_of_a_script_is_refused_with_the_advice_to_hand_it_over(notebook_checkpoint, capsys):
    with pytest.raises(CheckpointError) as info:
        Trainer.from_checkpoint(notebook_checkpoint, tracking=False, hparams={"model_cls": Net})
    message = str(info.value)
    assert "env = '__main__.Reach', which is not registered in this process" in message
    assert "defined in a script or notebook (__main__)" in message
    assert "rl8.register(Reach, name='__main__.Reach')" in message
    assert (
        "Trainer.from_checkpoint(path, env=Reach), or --env mymodule.Reach on the command line"
        in message
    )
    assert "trust" not in message  # importing __main__ would not find it
    assert main(["eval", str(notebook_checkpoint), "--episodes", "1"]) == 2
    assert "load_policy(path, model_cls=Net)" in capsys.readouterr().err


def test_classes_a_process_lacks_are_handed_over_at_load_time(notebook_checkpoint):
    resumed = Trainer.from_checkpoint(
        notebook_checkpoint, env=Reach, hparams={"model_cls": Net}, tracking=False
    )
    assert type(resumed.algo.env) is Reach and type(resumed.algo.policy.model) is Net
    resumed.close()
    assert type(load_policy(notebook_checkpoint, model_cls=Net).model) is Net
    assert type(load_policy(notebook_checkpoint, model_cls=f"{__name__}.Net").model) is Net
    with pytest.raises(ValueError, match=r"model_cls: expected an rl8 Model subclass.*Linear"):
        load_policy(notebook_checkpoint, model_cls=torch.nn.Linear)


def test_the_rl8_command_hands_a_scripts_env_over_with_env(notebook_checkpoint, capsys):
    rl8.register(Net, name="__main__.Net")  # the model: registered under the name the file uses
    assert main(["eval", str(notebook_checkpoint), "--episodes", "1"]) == 2
    assert "--env mymodule.Reach on the command line" in capsys.readouterr().err
    # --env names the module that defines the class now: it stands for __main__.Reach
    assert (
        main(
            [
                "eval",
                str(notebook_checkpoint),
                "--env",
                f"{__name__}.Reach",
                "--episodes",
                "1",
                "--max-steps",
                "5",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train",
                "--resume",
                str(notebook_checkpoint),
                "--env",
                f"{__name__}.Reach",
                "--max-steps",
                "128",
                "--quiet",
            ]
        )
        == 0
    )
    assert (
        main(["train", "--resume", str(notebook_checkpoint), "--env", "rl8.envs.Pendulum", "--quiet"])
        == 2
    )
    assert (
        "the checkpoint was trained on env '__main__.Reach', not 'rl8.envs.Pendulum'"
        in capsys.readouterr().err
    )


def test_registered_classes_load_under_the_names_a_file_uses(notebook_checkpoint):
    rl8.register(Reach, name="__main__.Reach")
    rl8.register(Net, name="__main__.Net")
    resumed = Trainer.from_checkpoint(notebook_checkpoint, tracking=False)
    assert type(resumed.algo.env) is Reach and type(resumed.algo.policy.model) is Net
    resumed.close()


def test_a_class_that_this_processs_main_defines_loads(tmp_path, monkeypatch):
    # a script that defines its env and resumes its own checkpoint: __main__.Reach is this class
    here = type("Reach", (CartPole,), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "Reach", here, raising=False)
    with Trainer(PPO(here, **SMALL), tracking=False, checkpoint_dir=tmp_path) as trainer:
        path = trainer.save_checkpoint()
    assert load_checkpoint(path)["env"]["spec"] == "__main__.Reach"
    resumed = Trainer.from_checkpoint(path, tracking=False)
    assert type(resumed.algo.env) is here
    resumed.close()


MYENV = '''
from rl8.envs import CartPole


class Reach(CartPole):
    """An env of the user's script folder."""
'''

TINY = "max_steps: 128\nhparams: {num_envs: 16, horizon: 8, sgd_minibatch_size: 64, num_sgd_iters: 1}\n"


@pytest.mark.slow
def test_the_rl8_script_imports_an_env_you_name_from_the_working_folder(tmp_path, migrated_store):
    (tmp_path / "myenv.py").write_text(MYENV)
    (tmp_path / "tiny.yaml").write_text(TINY)
    # what the installed rl8 script runs: sys.path holds its own folder, not the working folder
    script = (
        "import os, sys; sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != os.getcwd()]; "
        "from rl8.cli import main; sys.exit(main())"
    )

    def rl8_script(*argv):
        return subprocess.run(
            [sys.executable, "-c", script, *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    done = rl8_script("train", "tiny.yaml", "--env", "myenv.Reach", "--checkpoint-dir", "ck", "--quiet")
    assert done.returncode == 0, done.stderr
    [path] = (tmp_path / "ck").glob("checkpoint-*.pt")
    assert load_checkpoint(path)["env"]["spec"] == "myenv.Reach"
    done = rl8_script("eval", str(path), "--env", "myenv.Reach", "--episodes", "1", "--max-steps", "5")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_console_script_with_trust_code_imports_a_module_of_the_working_folder(tmp_path):
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


@pytest.mark.slow
def test_a_model_stored_as_main_net_is_handed_over_with_model_cls(tmp_path):
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


@pytest.mark.parametrize(
    "name",
    [
        "torch.nn.functional.torch.fx.GraphModule",
        "torch.nn.functional.torch.optim.swa_utils.AveragedModel",
        "torch.nn.functional.torch.nn.parallel.DistributedDataParallel",
        "torch.optim.lr_scheduler.torch.optim.Adam",
        "torch.nn.init.torch.nn.Linear",
        "torch.optim.swa_utils.AveragedModel",
    ],
)
def test_the_registry_never_walks_attributes_out_of_its_documented_sets(name):
    assert lookup(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "torch.nn.Linear",
        "torch.nn.modules.linear.Linear",
        "torch.optim.Adam",
        "torch.optim.adam.Adam",
        "torch.nn.Tanh",
    ],
)
def test_torch_classes_by_their_package_or_qualified_name_are_found(name):
    found = lookup(name)
    assert isinstance(found, type) and found.__name__ == name.rpartition(".")[2]
    assert found is getattr(torch.nn if ".nn." in name else torch.optim, found.__name__)
