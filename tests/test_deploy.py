"""Exported actors (rl8/policies/deploy.py, ``rl8 export``): the ONNX file (run by onnxruntime)
and the TorchScript file give the actions of ``Policy.predict(obs, deterministic=True)``."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

import rl8
from rl8 import PPO, Trainer
from rl8.cli import main
from rl8.envs import Pendulum
from rl8.io.export import load_policy
from rl8.policies.deploy import ExportError, export_policy, read_export_metadata
from rl8.policies.distributions import Normal
from rl8.policies.models import Model
from rl8.policies.policy import Policy
from rl8.policies.recurrent import LSTMModel

ort = pytest.importorskip("onnxruntime")
FORMATS = ("onnx", "torchscript")


class GroupsModel(Model):
    """Asymmetric actor-critic: the actor reads ``policy``, the critic ``policy`` and ``critic``."""

    actor_groups = ("policy",)

    def __init__(self, observation_space, action_space, distribution_cls, /):
        super().__init__(observation_space, action_space, distribution_cls)
        self.pi = nn.Sequential(
            nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, distribution_cls.param_size(action_space))
        )
        self.vf = nn.Linear(7, 1)

    def actor_params(self, obs):
        return self.pi(obs["policy"])

    def forward(self, obs):
        return self.actor_params(obs), self.vf(torch.cat([obs["policy"], obs["critic"]], -1))[:, 0]


def observations(space, n, seed):
    """``n`` observations of ``space`` (a dict of arrays for ``Dict``), widened so that
    normalisation clips some."""
    if isinstance(space, spaces.Dict):
        return {k: observations(sub, n, seed + i) for i, (k, sub) in enumerate(space.spaces.items())}
    space = spaces.Box(-5.0, 5.0, space.shape, np.float32) if isinstance(space, spaces.Box) else space
    space.seed(seed)
    return np.stack([space.sample() for _ in range(n)])


def with_statistics(policy, seed=0):
    """``policy`` with running statistics far from (0, 1), as after training."""
    generator = torch.Generator().manual_seed(seed)
    for stats in policy.obs_normalizer.stats.values():
        stats.update(
            3.0 + 2.0 * torch.randn((64, *stats.mean.shape), generator=generator, dtype=torch.float64)
        )
    return policy


BOX = spaces.Box(-1.0, 1.0, (4,), np.float32)
CASES = {
    "discrete": lambda: Policy(BOX, spaces.Discrete(5), normalize_observations=True),
    "dict": lambda: Policy(
        spaces.Dict(
            {
                "pos": spaces.Box(-1, 1, (2,), np.float32),
                "cell": spaces.Discrete(3),
                "action_mask": spaces.MultiBinary(4),
            }
        ),
        spaces.Discrete(4),
        normalize_observations=True,
    ),
    "actor_groups": lambda: Policy(
        spaces.Dict(
            {
                "policy": spaces.Box(-1, 1, (3,), np.float32),
                "critic": spaces.Box(-1, 1, (4,), np.float32),
            }
        ),
        spaces.Box(-2.0, 2.0, (2,), np.float32),
        model_cls=GroupsModel,
        normalize_observations=True,
    ),
    "multi_discrete": lambda: Policy(BOX, spaces.MultiDiscrete([3, 2]), model_config={"hiddens": [8]}),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, template_db):
    """A Pendulum run with observation normalisation: a few updates, one checkpoint folder and
    one MLflow run in a store of its own."""
    root = tmp_path_factory.mktemp("trained")
    shutil.copy(template_db, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    torch.manual_seed(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # MLflow's artifacts go beside its store
        algo = PPO(
            Pendulum,
            num_envs=8,
            horizon=16,
            sgd_minibatch_size=64,
            num_sgd_iters=1,
            normalize_observations=True,
            model_config={"hiddens": [16]},
            seed=0,
        )
        trainer = Trainer(algo, tracking_uri=uri, checkpoint_dir=str(root / "checkpoints"))
        trainer.run(max_env_steps=3 * 128)
        trainer.close()
    return {
        "policy": algo.policy.eval(),
        "uri": uri,
        "run_id": trainer.run_id,
        "checkpoints": root / "checkpoints",
    }


def run_onnx(path, inputs):
    session = ort.InferenceSession(str(path))
    return session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})


def actor_inputs(path, obs):
    """An exported actor's inputs by name, in its order, from observations as ``predict`` takes them."""
    names = [i["name"] for i in json.loads(read_export_metadata(path)["inputs"])]
    if names == ["obs"]:
        return {"obs": obs}
    return {k: obs[k].astype(bool) if k == "action_mask" else obs[k] for k in names}


def check_same_actions(policy, path, format, obs):
    expected, _ = policy.predict(obs, deterministic=True)
    inputs = actor_inputs(path, obs)
    if format == "onnx":
        actions = run_onnx(path, inputs)[0]
    else:
        actions = torch.jit.load(str(path))(*(torch.as_tensor(x) for x in inputs.values())).numpy()
    assert actions.dtype == expected.dtype and actions.shape == expected.shape
    assert np.abs(actions.astype(np.float64) - expected).max() <= 1e-5


@pytest.mark.parametrize("format", FORMATS)
def test_box_policy_with_normalisation_matches_predict(trained, tmp_path, format):
    policy = trained["policy"]
    stats = policy.obs_normalizer.stats["obs"]
    assert stats.count > 0 and not torch.allclose(stats.mean, torch.zeros_like(stats.mean))
    path = policy.export(tmp_path / f"pendulum.{format}", format)
    for n in (1, 7):
        check_same_actions(policy, path, format, observations(policy.observation_space, n, seed=n))
    props = read_export_metadata(path)
    assert props["rl8_version"] == rl8.version.__version__
    obs_space = json.loads(props["observation_space"])
    assert obs_space["type"] == "Box" and obs_space["shape"] == [3]
    action = json.loads(props["action_space"])
    assert action["low"] == [-2.0] and action["high"] == [2.0]
    assert json.loads(props["inputs"]) == [{"name": "obs", "shape": ["B", 3], "dtype": "float32"}]
    assert json.loads(props["outputs"]) == [{"name": "actions", "shape": ["B", 1], "dtype": "float32"}]
    assert props["normalize_observations"] == "true" and props["distribution_cls"] == "Normal"
    if format == "onnx":
        import onnx

        assert {p.key: p.value for p in onnx.load(str(path)).metadata_props} == props
        session = ort.InferenceSession(str(path))
        batch = session.get_inputs()[0].shape[0]
        assert isinstance(batch, str) and session.get_outputs()[0].shape[0] == batch  # one dynamic axis


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_policies_match_predict(case, format, tmp_path):
    torch.manual_seed(1)
    policy = CASES[case]()
    if policy.obs_normalizer is not None:
        with_statistics(policy)
    path = export_policy(policy, tmp_path / f"{case}.{format}", format)
    for n in (1, 9):
        check_same_actions(policy, path, format, observations(policy.observation_space, n, seed=10 + n))
    inputs = [i["name"] for i in json.loads(read_export_metadata(path)["inputs"])]
    if case == "actor_groups":
        assert inputs == ["policy"]  # the critic's observations are not an input
    if case == "dict":
        assert inputs == ["action_mask", "cell", "pos"]
        obs = observations(policy.observation_space, 16, seed=3)
        obs["action_mask"] = np.eye(4, dtype=np.int8)[np.arange(16) % 4]  # one allowed action per row
        check_same_actions(policy, path, format, obs)
        assert (policy.predict(obs)[0] == np.arange(16) % 4).all()


@pytest.mark.parametrize("format", FORMATS)
def test_recurrent_policy_carries_its_state(format, tmp_path):
    torch.manual_seed(3)
    space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    policy = with_statistics(
        Policy(
            space,
            spaces.Box(-1.0, 1.0, (2,), np.float32),
            model_cls=LSTMModel,
            model_config={"hidden_size": 8, "num_layers": 2},
            normalize_observations=True,
        )
    )
    path = policy.export(tmp_path / f"lstm.{format}", format)
    metadata = read_export_metadata(path)
    assert [i["name"] for i in json.loads(metadata["inputs"])] == ["obs", "state_h", "state_c"]
    assert [o["name"] for o in json.loads(metadata["outputs"])] == [
        "actions",
        "next_state_h",
        "next_state_c",
    ]
    actor = torch.jit.load(str(path)) if format == "torchscript" else None
    n, state, h, c = 5, None, np.zeros((5, 2, 8), np.float32), np.zeros((5, 2, 8), np.float32)
    for step in range(6):
        obs = observations(space, n, seed=step)
        start = np.arange(n) == step % n  # one env starts a new episode: its state is zeroed
        expected, state = policy.predict(obs, state=state, episode_start=start)
        h[start], c[start] = 0.0, 0.0
        if actor is None:
            actions, h, c = run_onnx(path, {"obs": obs, "state_h": h, "state_c": c})
        else:
            actions, h, c = (t.numpy() for t in actor(*(torch.as_tensor(x) for x in (obs, h, c))))
        assert np.abs(actions - expected).max() <= 1e-5
        assert (
            np.abs(h - state["h"].numpy()).max() <= 1e-5 and np.abs(c - state["c"].numpy()).max() <= 1e-5
        )


def test_unbounded_box_bounds_are_json(tmp_path):
    policy = Policy(
        spaces.Box(-np.inf, np.inf, (2,), np.float32), spaces.Box(-1.0, 1.0, (1,), np.float32)
    )
    metadata = read_export_metadata(policy.export(tmp_path / "p.pt", "torchscript"))
    assert json.loads(metadata["observation_space"])["low"] == ["-inf", "-inf"]


class NoMode(Normal):
    def deterministic_sample(self):
        raise NotImplementedError


class Untraceable(Model):
    """Reads a tensor's value into Python (TorchScript's trace freezes it) and branches on it
    (``torch.export`` refuses to)."""

    def __init__(self, observation_space, action_space, distribution_cls, /):
        super().__init__(observation_space, action_space, distribution_cls)
        self.pi = nn.Linear(4, distribution_cls.param_size(action_space))

    def forward(self, obs):
        scale = float(obs.abs().max())
        return self.pi(obs) * (scale if scale > 0.5 else -scale), obs[:, 0]


class ExportsOtherwise(Model):
    """Computes something else while torch.export traces it: the trace succeeds, its program differs."""

    def __init__(self, observation_space, action_space, distribution_cls, /):
        super().__init__(observation_space, action_space, distribution_cls)
        self.pi = nn.Linear(4, distribution_cls.param_size(action_space))

    def forward(self, obs):
        return self.pi(obs) * (-1.0 if torch.compiler.is_exporting() else 1.0), obs[:, 0]


def test_an_export_that_differs_from_the_model_is_refused(tmp_path):
    policy = Policy(BOX, spaces.Box(-1.0, 1.0, (2,), np.float32), model_cls=ExportsOtherwise)
    message = (
        "cannot export ExportsOtherwise with Normal as onnx \\(the exported program's actions differ"
    )
    with pytest.raises(ExportError, match=message):
        policy.export(tmp_path / "a.onnx")
    assert list(tmp_path.iterdir()) == []


def test_what_cannot_be_exported_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ExportError, match="NoMode has no deterministic action"):
        Policy(BOX, spaces.Box(-1.0, 1.0, (2,), np.float32), distribution_cls=NoMode).export(
            tmp_path / "a.onnx"
        )
    policy = Policy(BOX, spaces.Discrete(3), model_cls=Untraceable)
    message = "cannot export Untraceable with Categorical as onnx .*; try format='torchscript'"
    with pytest.raises(ExportError, match=message):
        policy.export(tmp_path / "b.onnx")
    with pytest.raises(
        ExportError, match="cannot export Untraceable .* as torchscript.*try format='onnx'"
    ):
        policy.export(tmp_path / "b.pt", "torchscript")
    with pytest.raises(
        ValueError, match=r"format: expected one of \['onnx', 'torchscript'\], got 'tflite'"
    ):
        policy.export(tmp_path / "c.tflite", "tflite")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "onnxscript" else True)
    with pytest.raises(
        ImportError,
        match=r'ONNX export needs onnx and onnxscript, the onnx extra: pip install -e "\.\[onnx\]"',
    ):
        policy.export(tmp_path / "d.onnx")


# --------------------------------------------------------------------------------------------
# rl8 export


def test_export_command_from_a_checkpoint_folder_and_a_run_id(trained, tmp_path, capsys):
    assert main(["export", str(trained["checkpoints"]), "-o", "out/policy.onnx"]) == 0
    assert capsys.readouterr().out.strip() == "out/policy.onnx"
    policy = load_policy(trained["checkpoints"])
    check_same_actions(
        policy, tmp_path / "out" / "policy.onnx", "onnx", observations(policy.observation_space, 4, 0)
    )
    argv = ["export", trained["run_id"], "--tracking-uri", trained["uri"], "--format", "torchscript"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == "policy.pt"
    check_same_actions(
        policy, tmp_path / "policy.pt", "torchscript", observations(policy.observation_space, 4, 1)
    )
    assert main(argv) == 0  # an export is overwritten


@pytest.mark.parametrize(
    "output, message",
    [
        ("", "-o/--output: expected a file name, got an empty string"),
        (".", "-o/--output: . is a folder; give a file name"),
        (
            "notes.txt",
            "-o/--output: notes.txt exists and is not an rl8 export; pass --force to overwrite it",
        ),
    ],
)
def test_export_command_refuses_bad_outputs(trained, tmp_path, capsys, output, message):
    (tmp_path / "notes.txt").write_text("keep me")
    assert main(["export", str(trained["checkpoints"]), "-o", output]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rl8: error: {message}") and err.count("\n") == 1
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_export_command_force_and_bad_format(trained, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    assert (
        main(
            [
                "export",
                str(trained["checkpoints"]),
                "-o",
                "notes.txt",
                "--force",
                "--format",
                "torchscript",
            ]
        )
        == 0
    )
    assert read_export_metadata(tmp_path / "notes.txt") is not None
    with pytest.raises(SystemExit) as exc:
        main(["export", str(trained["checkpoints"]), "--format", "tflite"])
    assert exc.value.code == 2 and "invalid choice: 'tflite'" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nope")]) == 1
    assert "no policy at" in capsys.readouterr().err
