"""Actors and learners (``rl8 train --actors N``) on CPU with gloo: 3-process jobs.

A 3-process job (2 actors, 1 learner) solves CartPole with one MLflow run and a policy lag
within ``max_staleness``, and its resume goes on in the same run; its checkpoints hold each
actor's own state, which each actor gets back exactly on resume; an actor killed mid-run ends
the job with an error naming it, within a bounded time. The 4-process job and the synchronous
mode are in ``tests/test_actors_sync.py`` (a second file, so that ``pytest -n 2 --dist
loadfile`` runs both at once). Each job is bounded by a timeout and its process group killed
in teardown, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import launch
import pytest
from launch import Launch, free_port

THIS_FILE = str(Path(__file__).resolve())

# 2 actors x 32 envs fill the learner's 64-env batch; eval on the learner's own 8 envs
CARTPOLE_CONFIG = """\
env: rl8.envs.CartPole
hparams:
  seed: 0
  device: cpu
  num_envs: 64              # one learner's batch, split among its actors
  sgd_minibatch_size: 512
eval_num_envs: 8
steps_per_eval: 2
stop_conditions:
  - hits_upper_bound: {key: eval/episodes/return_mean, bound: 475}
max_steps: 200000
experiment: actors
log_every: 1
checkpoint_dir: ckpts
"""
MAX_STEPS = 200_000


def torchrun(
    args: list[str], *, nproc: int, timeout: float = 150, env: dict[str, str] | None = None
) -> Launch:
    """:func:`launch.torchrun` with a 60 s bound on the job's collectives (``RL8_DIST_TIMEOUT_S``)."""
    return launch.torchrun(
        args, nproc=nproc, timeout=timeout, env={"RL8_DIST_TIMEOUT_S": "60", **(env or {})}
    )


def history(client, run_id: str, key: str) -> list[float]:
    """A metric's values in step order."""
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


# --------------------------------------------------------------------------------------------
# the parts, in one process


def test_flat_layout_round_trips_a_rollout_into_a_block_of_rows():
    import torch

    from rl8 import PPO
    from rl8.envs import CartPole
    from rl8.training.actors import FlatLayout, _leaves

    actor = PPO(CartPole, num_envs=4, horizon=8, seed=1, device="cpu")
    learner = PPO(CartPole, num_envs=8, horizon=8, seed=2, device="cpu")
    actor.collect()
    layout = FlatLayout(_leaves(actor.buffer.data))
    assert layout.nbytes % 8 == 0
    assert {name for name, *_ in layout.fields} >= {
        "obs",
        "actions",
        "logp",
        "values",
        "rewards",
        "terminated",
    }
    flat = layout.pack(_leaves(actor.buffer.data), layout.empty())
    before = learner.buffer.data[:4].clone()
    layout.unpack(flat, _leaves(learner.buffer.data[4:8]))  # the second actor's block of rows
    for key, value in actor.buffer.data.items():
        assert torch.equal(learner.buffer.data[4:8][key], value), key
        assert torch.equal(learner.buffer.data[:4][key], before[key]), key  # the other rows untouched


def test_truncated_importance_weights_are_one_on_policy_and_capped_off_policy():
    import torch

    from rl8 import PPO
    from rl8.envs import CartPole
    from rl8.training.actors import truncated_importance_weights

    def make():
        return PPO(
            CartPole,
            num_envs=8,
            horizon=16,
            seed=3,
            device="cpu",
            num_sgd_iters=2,
            sgd_minibatch_size=32,
        )

    # on-policy data: every weight is 1 and the update is the plain one
    plain, weighted = make(), make()
    plain.collect()
    weighted.collect()
    stored = weighted.buffer.data["logp"].clone()
    weights = truncated_importance_weights(weighted, cap=1.0)
    torch.testing.assert_close(weights, torch.ones_like(weights))
    torch.testing.assert_close(weighted.buffer.data["logp"], stored)
    plain.update()
    weighted.update()
    assert weighted.advantage_weights is None  # used by one update only
    for key, value in plain.policy.state_dict().items():
        torch.testing.assert_close(
            weighted.policy.state_dict()[key], value, rtol=1e-5, atol=1e-6, msg=key
        )

    # off-policy data (one update old): the ratio of the new to the behaviour policy, capped
    behaviour = make()
    behaviour.collect()
    behaviour.update()  # the weights moved on since the buffer was collected
    stored = behaviour.buffer.data["logp"][:, :16].clone()
    proximal = behaviour.policy.evaluate(behaviour.buffer.training_samples(stored * 0, stored * 0))[
        0
    ].detach()
    weights = truncated_importance_weights(behaviour, cap=1.05)
    torch.testing.assert_close(weights, (proximal.reshape(8, 16) - stored).exp().clamp(max=1.05))
    assert weights.max() <= 1.05 and not torch.equal(weights, torch.ones_like(weights))
    torch.testing.assert_close(behaviour.buffer.data["logp"][:, :16], proximal.reshape(8, 16))
    behaviour.update()


def test_roles_split_ranks_into_learners_first_then_actors():
    from rl8.ppo.distributed import Roles

    roles = Roles(rank=0, world_size=6, actors=4)
    assert roles.learners == 2 and roles.actors_per_learner == 2 and not roles.is_actor
    assert roles.actors_of(0) == [2, 4] and roles.actors_of(1) == [3, 5]
    assert Roles(rank=3, world_size=6, actors=4).is_actor
    with pytest.raises(ValueError, match="actors: expected an int from 1 to 2 .* got 3"):
        Roles(rank=0, world_size=3, actors=3)
    with pytest.raises(ValueError, match="actors: expected a multiple of the number of learners \\(2"):
        Roles(rank=0, world_size=5, actors=3)


def test_bad_actor_options_are_refused_naming_them(monkeypatch):
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.ppo.distributed import init_distributed
    from rl8.training.config import TrainerConfig

    with pytest.raises(ValueError, match="max_staleness must be an int >= 0, got -1"):
        TrainerConfig(max_staleness=-1)
    with pytest.raises(
        ValueError,
        match="max_staleness must be >= weight_sync_interval - 1 .* max_staleness=1 with weight_sync_interval=3",
    ):
        TrainerConfig(weight_sync_interval=3)
    with pytest.raises(
        ValueError, match="weight_sync must be one of 'broadcast', 'checkpoint', got 'nccl'"
    ):
        TrainerConfig(weight_sync="nccl")
    with pytest.raises(ValueError, match="importance_weight_cap must be a number > 0 or None, got 0"):
        TrainerConfig(importance_weight_cap=0)
    with pytest.raises(ValueError, match="weight_sync='checkpoint' needs weight_sync_dir"):
        TrainerConfig(weight_sync="checkpoint")
    assert TrainerConfig(max_staleness=0).max_staleness == 0
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="actors=2: actors and learners need a torchrun job"):
        init_distributed(actors=2)
    algo = PPO(CartPole, num_envs=4, horizon=8, seed=0, device="cpu")
    with pytest.raises(ValueError, match="actors=2 but the process group was set up with actors=None"):
        Trainer(algo, actors=2, tracking=False)


def same_state(a, b, where: str = "state") -> None:
    """Assert that two nested dicts/lists of tensors and plain values are equal, naming where not."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for key in a:
            same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_an_actor_resumes_its_own_state_and_an_older_checkpoint_starts_its_envs_anew(
    tmp_path, monkeypatch
):
    """One process playing actor rank 1 of a 3-process job: its entry of a checkpoint written
    to disk is loaded exactly (its next rollout is the one it would have collected); without
    actor entries (a checkpoint of an older rl8) its envs start anew, seeded as before; actor
    entries of another job shape are refused."""
    import torch

    import rl8.ppo.distributed
    from rl8 import PPO
    from rl8.envs import CartPole
    from rl8.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from rl8.io.checkpoint_dir import checkpoint_for_actor
    from rl8.ppo.distributed import Roles, derive_seed
    from rl8.training.actors import actor_state
    from rl8.training.resume import algo_from_checkpoint

    learner = PPO(CartPole, num_envs=8, horizon=8, seed=0, device="cpu")  # the learners' 8-env batch
    learner.steps = 3  # as if 3 updates were done
    monkeypatch.setattr(rl8.ppo.distributed, "_roles", Roles(rank=1, world_size=3, actors=2))
    actor = PPO(CartPole, num_envs=8, horizon=8, seed=0, device="cpu")
    assert actor.hparams.num_envs == 4  # its share
    for _ in range(3):
        actor.collect()
    entry = actor_state(actor)
    assert entry["counters"]["collects"] == 3 and "policy" not in entry and "optimizer" not in entry
    state = {
        "algo": learner.state_dict(),
        "trainer": {},
        "env": {"spec": "rl8.envs.CartPole"},
        "actors": {"world_size": 3, "actors": 2, "ranks": {1: entry, 2: entry}},
    }
    file = save_checkpoint(state, tmp_path / "checkpoint.pt")

    view = checkpoint_for_actor(load_checkpoint(file), file, 1)
    assert "actors" not in view
    resumed = algo_from_checkpoint(file, view, env=None, hparams=None, trust_code=False)
    same_state(actor_state(resumed), entry)
    actor.collect()
    resumed.collect()
    for key, value in actor.buffer.data.items():
        assert torch.equal(resumed.buffer.data[key], value), key

    # a checkpoint without actor entries: fresh envs, seeded from the rank and the update count
    older = {k: v for k, v in state.items() if k != "actors"}
    fresh = algo_from_checkpoint(
        file, checkpoint_for_actor(older, file, 1), env=None, hparams=None, trust_code=False
    )
    assert fresh.next_collect_resets and fresh.collects == learner.collects
    seed = derive_seed(
        actor.env_seed, 3 + 1
    )  # the env seed of a new actor, moved on by the update count
    assert fresh.env_seed == seed
    assert torch.equal(fresh.generator.get_state(), torch.Generator().manual_seed(seed).get_state())

    monkeypatch.setattr(rl8.ppo.distributed, "_roles", Roles(rank=1, world_size=4, actors=3))
    with pytest.raises(
        CheckpointError,
        match="2 actors of a job of 3 processes, but this job has 3 actors of 4.*"
        "--nproc_per_node=3 .* --actors 2",
    ):
        checkpoint_for_actor(load_checkpoint(file), file, 1)

    # a malformed actors entry (a crafted or damaged file) is named, not a KeyError deep inside
    for bad in (
        {"world_size": 3, "actors": 2, "ranks": [entry]},
        {"world_size": "3", "actors": 2, "ranks": {}},
        {"world_size": 3, "actors": 2, "ranks": {"1": entry}},
        ["not", "a", "dict"],
    ):
        with pytest.raises(CheckpointError, match="entry 'actors': expected .*'ranks'.* got "):
            checkpoint_for_actor({**state, "actors": bad}, file, 1)


def test_a_checkpoint_holds_every_actors_state_or_none(tmp_path, monkeypatch):
    """Learner rank 0 of a job of 1 learner and 2 actors writes the ``actors`` entry only with
    every actor's state: not after the actors were told to stop (``{}``), not with one missing."""
    import rl8.ppo.distributed
    from rl8 import PPO
    from rl8.envs import CartPole
    from rl8.io.checkpoint import load_checkpoint
    from rl8.ppo.distributed import DistContext, Roles
    from rl8.training.resume import write_checkpoint

    algo = PPO(CartPole, num_envs=4, horizon=8, seed=0, device="cpu")
    monkeypatch.setattr(rl8.ppo.distributed, "_roles", Roles(rank=0, world_size=3, actors=2))
    entry = {"counters": {"collects": 1}}

    def written(actors):
        path = write_checkpoint(
            {"algo": algo.state_dict()}, tmp_path / "c.pt", None, None, 0, DistContext(), actors
        )
        return load_checkpoint(path).get("actors")

    assert written({1: entry, 2: entry}) == {"world_size": 3, "actors": 2, "ranks": {1: entry, 2: entry}}
    assert written({}) is None and written({1: entry}) is None and written(None) is None


def test_cli_takes_the_actor_flags():
    from rl8.cli import build_parser

    args = build_parser().parse_args(
        [
            "train",
            "--actors",
            "2",
            "--max-staleness",
            "0",
            "--weight-sync-interval",
            "1",
            "--weight-sync",
            "checkpoint",
            "--weight-sync-dir",
            "w",
        ]
    )
    assert (
        args.actors,
        args.max_staleness,
        args.weight_sync_interval,
        args.weight_sync,
        args.weight_sync_dir,
    ) == (2, 0, 1, "checkpoint", "w")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--actors", "0"])


# --------------------------------------------------------------------------------------------
# 2 actors, 1 learner: solves CartPole, one run, lag within max_staleness; resume goes on


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_actors_one_learner_solve_cartpole_and_resume_the_same_run(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from rl8.io.checkpoint import load_checkpoint

    config = tmp_path / "cartpole.yaml"
    config.write_text(CARTPOLE_CONFIG)
    job = torchrun(
        ["-m", "rl8", "train", str(config), "--quiet", "--actors", "2", "--max-staleness", "1"], nproc=3
    )
    assert job.returncode == 0, job.output
    assert job.output.count("run id:") == 1, "only learner rank 0 prints the summary"
    assert re.search(
        r"resume:     torchrun --nproc_per_node=3 -m rl8 train --resume \S+ --actors 2\n", job.output
    )

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("actors")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, "one MLflow run for the job"
    run = runs[0]
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["distributed/actors"] == "2"
    assert run.data.params["distributed/learners"] == "1"
    assert run.data.params["trainer/max_staleness"] == "1"
    assert run.data.metrics["eval/episodes/return_mean"] >= 475
    steps = history(client, run_id, "env/steps")
    assert steps[:2] == [64 * 32, 2 * 64 * 32]  # env steps: transitions the learner used
    assert steps[-1] < MAX_STEPS
    lags = history(client, run_id, "monitors/policy_lag")
    assert len(lags) == len(steps) and max(lags) <= 1
    # the actors' side, reduced to the learner's run
    collected = history(client, run_id, "actors/env_steps")
    dropped = history(client, run_id, "actors/dropped_rollouts")
    assert (
        collected[-1] == steps[-1] + dropped[-1] * 32 * 32
    )  # every rollout received is used or dropped
    assert min(history(client, run_id, "throughput/actor_env_steps_per_s")) > 0
    for key in ("profiling/actor_wait_ms", "profiling/learner_wait_ms", "episodes/return_mean"):
        assert key in run.data.metrics
    files = sorted((tmp_path / "ckpts").glob("*.pt"))
    assert len(files) == 1, files  # one checkpoint stream, written by learner rank 0
    state = load_checkpoint(files[0])
    assert state["trainer"]["actors"] == 2
    assert state["algo"]["counters"]["env_steps"] == steps[-1]

    # resume the 3-process job with a further step bound: the same run goes on
    bound = int(steps[-1]) + 2 * 64 * 32
    job = torchrun(
        [
            "-m",
            "rl8",
            "train",
            "--resume",
            str(tmp_path / "ckpts"),
            "--quiet",
            "--actors",
            "2",
            "--max-steps",
            str(bound),
        ],
        nproc=3,
    )
    assert job.returncode == 0, job.output
    assert len(client.search_runs([experiment.experiment_id])) == 1
    resumed = history(client, run_id, "env/steps")
    assert resumed[: len(steps)] == steps and resumed[len(steps) :] == [steps[-1] + 64 * 32, bound]
    assert client.get_run(run_id).info.status == "FINISHED"


# --------------------------------------------------------------------------------------------
# the actors' own state in the checkpoint, and back in each actor on resume


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_checkpoints_hold_each_actors_state_and_resume_restores_it(tmp_path):
    import torch

    from rl8.io.checkpoint import load_checkpoint
    from rl8.io.checkpoint_dir import CheckpointManager

    job = torchrun([THIS_FILE, "actor-state", str(tmp_path), "train"], nproc=3, timeout=120)
    assert job.returncode == 0, job.output
    files = CheckpointManager(tmp_path / "ckpts", keep_last=None).list()
    assert len(files) == 2, (
        files
    )  # at update 2 (actors collecting: their rollouts held) and the final one
    middle, final = (load_checkpoint(f) for f in files)
    for state in (middle, final):
        assert set(state["actors"]) == {"world_size", "actors", "ranks"}
        assert (state["actors"]["world_size"], state["actors"]["actors"]) == (3, 2)
        assert sorted(state["actors"]["ranks"]) == [1, 2]
        one, two = state["actors"]["ranks"][1], state["actors"]["ranks"][2]
        assert "policy" not in one and one["obs"] is not None and one["env"] is not None
        assert not torch.equal(one["rng"]["generator"], two["rng"]["generator"])  # each actor its own
    # the final checkpoint came just before the stop: each actor's entry is its state at its end
    for rank in (1, 2):
        same_state(
            torch.load(tmp_path / f"train-end-{rank}.pt", weights_only=True),
            final["actors"]["ranks"][rank],
        )
    # an actor's state at a checkpoint is after the rollout it was collecting: one more than
    # the learner used (one per update), which the learner held for its next update
    for state in (middle, final):
        assert (
            state["actors"]["ranks"][1]["counters"]["collects"] == state["algo"]["counters"]["steps"] + 1
        )

    # resume the job from the middle checkpoint: each actor gets back its own state exactly
    job = torchrun([THIS_FILE, "actor-state", str(tmp_path), str(files[0])], nproc=3, timeout=120)
    assert job.returncode == 0, job.output
    for rank in (1, 2):
        same_state(
            torch.load(tmp_path / f"resumed-{rank}.pt", weights_only=True),
            middle["actors"]["ranks"][rank],
        )
    last = load_checkpoint(CheckpointManager(tmp_path / "ckpts", keep_last=None).latest())
    assert last["algo"]["counters"]["steps"] == 4  # it went on: 2 more updates
    # the actor went on from its 3rd rollout (which the resumed learner never got: skipped),
    # collected one for each of the 2 updates and one held for the final checkpoint
    assert last["actors"]["ranks"][1]["counters"]["collects"] == 3 + 2 + 1


def _worker_actor_state(out: Path, checkpoint: str) -> None:
    """2 actors, 1 learner (Python API), checkpoints every 2 updates: ``train`` does 3 updates,
    anything else resumes that checkpoint for 2 more. Each actor saves its state
    (:func:`rl8.training.actors.actor_state`) after resuming and at its end."""
    import torch

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.ppo.distributed import init_distributed
    from rl8.training.actors import actor_state
    from rl8.training.conditions import HitsUpperBound

    torch.set_num_threads(1)
    init_distributed(actors=2)
    rank = int(os.environ["RANK"])
    options = {"tracking": False, "progress": False}
    if checkpoint == "train":
        algo = PPO(CartPole, num_envs=16, horizon=8, seed=0, device="cpu")
        trainer = Trainer(
            algo,
            actors=2,
            checkpoint_dir=str(out / "ckpts"),
            checkpoint_every=2,
            keep_checkpoints=None,
            **options,
        )
        updates = 3
    else:
        trainer = Trainer.from_checkpoint(checkpoint, **options)
        updates = trainer.algo.steps + 2
        if trainer.is_actor:
            torch.save(actor_state(trainer.algo), out / f"resumed-{rank}.pt")
    trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", updates))
    if trainer.is_actor and checkpoint == "train":
        torch.save(actor_state(trainer.algo), out / f"train-end-{rank}.pt")


# --------------------------------------------------------------------------------------------
# SIGTERM to the job (what torchrun forwards to every rank on Ctrl-C or from a scheduler)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_stops_every_rank_with_a_checkpoint_and_a_killed_run(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from rl8.io.checkpoint import load_checkpoint

    config = tmp_path / "cartpole.yaml"
    config.write_text(
        CARTPOLE_CONFIG.replace("max_steps: 200000", "max_steps: 100000000") + "checkpoint_every: 2\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=3",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "rl8",
        "train",
        str(config),
        "--quiet",
        "--actors",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RL8_DIST_TIMEOUT_S": "60"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while (
            not list((tmp_path / "ckpts").glob("*.pt"))
            and time.monotonic() < deadline
            and proc.poll() is None
        ):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to every rank
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        seconds = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "DistributedError" not in output, output[-4000:]
    assert "rl8: SIGTERM: checkpoint written to" in output, output[-4000:]
    assert seconds < 30
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("actors").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    steps = runs[0].data.metrics["env/steps"]
    stop_checkpoint = tmp_path / "ckpts" / f"checkpoint-{int(steps):012d}.pt"
    assert stop_checkpoint.is_file()  # the stop step's checkpoint, with the actors' states
    assert sorted(load_checkpoint(stop_checkpoint)["actors"]["ranks"]) == [1, 2]


# --------------------------------------------------------------------------------------------
# an actor dies: the job ends with an error naming it, within a bounded time


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_dead_actor_ends_the_job_with_an_error_naming_it(tmp_path):
    job = torchrun(
        [THIS_FILE, "die", str(tmp_path)], nproc=3, timeout=120, env={"RL8_DIST_TIMEOUT_S": "30"}
    )
    assert job.returncode != 0
    # the learner's error names the actor; torchrun, which ends the other ranks as soon as it
    # sees one die, may stop the learner before it prints, and then names the rank itself
    named = "learner rank 0: receiving a rollout from actor rank 2 failed: rank 2 died" in job.output
    assert named or re.search(r"failed \(exitcode: -9\) local_rank: 2", job.output), job.output[-4000:]
    # bounded: well within the 30 s timeout of a stalled peer, plus start-up
    assert job.seconds < 60, job.seconds


def _worker_die(out: Path) -> None:
    """2 actors, 1 learner (Python API); actor rank 2 kills itself on its 3rd rollout."""
    import torch

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.ppo.distributed import init_distributed
    from rl8.training.conditions import HitsUpperBound

    torch.set_num_threads(1)

    class DyingCartPole(CartPole):
        calls = 0

        def step(self, action):
            DyingCartPole.calls += 1
            if os.environ["RANK"] == "2" and DyingCartPole.calls == 3 * 8:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().step(action)

    init_distributed(actors=2)
    algo = PPO(DyingCartPole, num_envs=16, horizon=8, seed=0, device="cpu")
    trainer = Trainer(algo, actors=2, tracking=False, checkpoint_dir=str(out / "ckpts"), progress=False)
    trainer.run(stop_conditions=HitsUpperBound("env/steps", 10**9))


if __name__ == "__main__":
    if sys.argv[1] == "die":
        _worker_die(Path(sys.argv[2]))
    else:
        _worker_actor_state(Path(sys.argv[2]), sys.argv[3])
