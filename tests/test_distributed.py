"""Data-parallel training with torchrun: 2 processes on CPU with the gloo backend.

Each test launches ``python -m torch.distributed.run --nproc_per_node=2`` (on a free port)
either on ``rl8 train`` or on this very file, whose ``__main__`` block holds the workers; every
worker uses one torch thread. The launch is bounded by a timeout and its process group is
killed in teardown, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from launch import torchrun

THIS_FILE = str(Path(__file__).resolve())

# (a): one update, one minibatch (the whole buffer), episodes truncated within the horizon so
# that the bootstrap from final_obs is part of what must match.
UPDATE_HPARAMS = {
    "num_envs": 8,
    "horizon": 8,
    "sgd_minibatch_size": None,
    "num_sgd_iters": 1,
    "seed": 0,
    "device": "cpu",
    "normalize_rewards": True,
    "normalize_observations": True,
    "env_config": {"max_episode_steps": 5},
}
# Adam's first step hardly depends on the gradients' scale (and clipping rescales them): plain
# SGD without clipping also checks that the gradients are averaged, not summed, and that the
# rollout's advantage moments (normalize_advantages_over="rollout") cover both ranks' samples.
UPDATE_OPTIMIZERS = {
    "adam": {},
    "sgd": {
        "optimizer_cls": "torch.optim.SGD",
        "optimizer_kwargs": {},
        "lr": 0.5,
        "max_grad_norm": None,
        "normalize_advantages_over": "rollout",
    },
}
# resume test: a small CartPole run
RESUME_HPARAMS = {
    "num_envs": 16,
    "horizon": 8,
    "sgd_minibatch_size": 64,
    "num_sgd_iters": 2,
    "seed": 3,
    "device": "cpu",
}


def _tensors_equal(a, b, where: str = "") -> None:
    """Assert two nested dicts/lists of tensors and plain values are exactly equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _tensors_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _tensors_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# --------------------------------------------------------------------------------------------
# (a) one update on 2 ranks == one update in one process that owns both ranks' envs


@pytest.fixture
def one_thread():
    """One torch thread, as in the workers (orthogonal init depends on the thread count in
    the last bits)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def one_update_job(tmp_path_factory):
    """Both ranks' buffers, parameters and stats around one update, for each optimizer."""
    out = tmp_path_factory.mktemp("one_update")
    job = torchrun([THIS_FILE, "one_update", str(out)])
    assert job.returncode == 0, job.output
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("optimizer", list(UPDATE_OPTIMIZERS))
def test_one_update_on_two_ranks_equals_one_process_with_all_envs(one_update_job, one_thread, optimizer):
    from tensordict import TensorDict

    from rl8 import PPO
    from rl8.envs import CartPole

    r0, r1 = (torch.load(one_update_job / f"{optimizer}-rank{r}.pt", weights_only=False) for r in (0, 1))
    h, n = UPDATE_HPARAMS["horizon"], UPDATE_HPARAMS["num_envs"]

    # the model is initialised from the run's seed, the envs from seeds derived from the rank
    single = PPO(CartPole, **{**UPDATE_HPARAMS, **UPDATE_OPTIMIZERS[optimizer], "num_envs": 2 * n})
    _tensors_equal(r0["before"], r1["before"])
    _tensors_equal(dict(single.policy.state_dict()), r0["before"])
    assert not torch.equal(r0["data"]["obs"], r1["data"]["obs"])
    data = torch.cat([TensorDict(r["data"], batch_size=[n, h + 1]) for r in (r0, r1)], 0)
    assert bool(data["truncated"].any()), "the test should cover bootstrapping at truncations"

    # the process that owns both ranks' envs sees the same data...
    single.buffer.data.update_(data)
    single.collects = 1
    dones = data["terminated"][:, :h] | data["truncated"][:, :h]
    normalizer = single.reward_normalizer
    normalizer.stats.update(normalizer.advance(data["rewards"][:, :h], dones).reshape(-1))
    # ... and its running reward statistics are the ranks' reduced ones
    for key, value in r0["reward_stats"].items():
        torch.testing.assert_close(r1["reward_stats"][key], value, rtol=0, atol=0)
        torch.testing.assert_close(
            single.reward_normalizer.stats.state_dict()[key], value, rtol=1e-5, atol=1e-6
        )
    single.update()

    after = dict(single.policy.state_dict())
    moved = max((r0["after"][k].float() - r0["before"][k].float()).abs().max().item() for k in after)
    assert moved > 1e-4, "the update should change the parameters"
    for key, value in after.items():
        assert torch.equal(r0["after"][key], r1["after"][key]), f"ranks differ at {key}"
        torch.testing.assert_close(value, r0["after"][key], rtol=1e-5, atol=1e-5, msg=key)
    # the reported update stats are the same on every rank
    assert r0["update_stats"] == r1["update_stats"]
    assert r0["rollout_stats"] == r1["rollout_stats"]
    # ... and cover both ranks' envs: the mean return of all 16 envs
    assert r0["rollout_stats"]["rollout/reward_sum_mean"] == pytest.approx(
        float(data["rewards"][:, :h].sum(1).double().mean()), rel=1e-6
    )


# --------------------------------------------------------------------------------------------
# (b) rl8 train on 2 ranks solves CartPole; only rank 0 tracks and checkpoints


CARTPOLE_CONFIG = """\
env: rl8.envs.CartPole
hparams:
  seed: 0
  device: cpu
  num_envs: 64              # per rank
  sgd_minibatch_size: 512   # per rank: 1024 transitions per optimizer step in all
eval_num_envs: 8            # per rank
steps_per_eval: 2
stop_conditions:
  - hits_upper_bound: {key: eval/episodes/return_mean, bound: 475}
max_steps: 400000
experiment: dist
log_every: 1
checkpoint_dir: ckpts
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_rank_rl8_train_solves_cartpole(tmp_path, mlflow_uri):
    config = tmp_path / "cartpole.yaml"
    config.write_text(CARTPOLE_CONFIG)
    job = torchrun(["-m", "rl8", "train", str(config), "--quiet"])
    assert job.returncode == 0, job.output
    assert job.output.count("run id:") == 1, "only rank 0 prints the summary"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("dist")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, "only rank 0 talks to MLflow"
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["distributed/world_size"] == "2"
    assert run.data.metrics["eval/episodes/return_mean"] >= 475
    # the logged stats cover both ranks' envs: 2 x 8 eval carts, each ending >= 1 episode
    assert run.data.metrics["eval/episodes/count"] >= 16
    steps = client.get_metric_history(run.info.run_id, "env/steps")
    assert [m.value for m in steps][:2] == [2 * 64 * 32, 4 * 64 * 32]  # env steps of both ranks
    assert steps[-1].value < 400000

    from rl8.io.checkpoint import load_checkpoint

    files = sorted((tmp_path / "ckpts").glob("*.pt"))
    assert len(files) == 1, files  # one file, written by rank 0 only
    state = load_checkpoint(files[0])
    assert state["distributed"]["world_size"] == 2
    ranks = state["distributed"]["ranks"]
    assert len(ranks) == 2 and "policy" not in ranks[1]  # shared state is stored once
    assert not torch.equal(ranks[0]["obs"]["tensor"], ranks[1]["obs"]["tensor"])  # each rank's envs

    # resuming through the CLI: rank 0 reads the file and hands rank 1 its part; the same
    # MLflow run goes on, and its stored stop condition already held: zero more steps
    job = torchrun(["-m", "rl8", "train", "--resume", str(tmp_path / "ckpts"), "--quiet"])
    assert job.returncode == 0, job.output
    assert "resume:     torchrun --nproc_per_node=2 -m rl8 train --resume" in job.output
    assert len(client.search_runs([experiment.experiment_id])) == 1
    resumed = client.get_metric_history(run.info.run_id, "env/steps")
    assert resumed[-1].value == steps[-1].value
    assert len(sorted((tmp_path / "ckpts").glob("*.pt"))) == 1


# --------------------------------------------------------------------------------------------
# checkpoints: a signal on one rank checkpoints every rank; resuming restores every rank


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_signal_checkpoint_and_resume_restore_every_rank(tmp_path):
    from rl8 import Trainer
    from rl8.io.checkpoint import CheckpointError, load_checkpoint

    job = torchrun([THIS_FILE, "resume", str(tmp_path)])
    assert job.returncode == 0, job.output
    step = 2 * RESUME_HPARAMS["num_envs"] * RESUME_HPARAMS["horizon"]
    # SIGUSR1 reached rank 1 only, after step 2: both ranks checkpointed there (rank 0 wrote)
    files = sorted(p.name for p in (tmp_path / "a").glob("*.pt"))
    assert files == [f"checkpoint-{2 * step:012d}.pt", f"checkpoint-{4 * step:012d}.pt"]
    assert "rl8: SIGUSR1: checkpoint written to" in job.output
    state = load_checkpoint(tmp_path / "a" / files[0])
    assert state["distributed"]["world_size"] == 2
    assert state["algo"]["counters"]["env_steps"] == 2 * step

    for rank in (0, 1):
        straight = torch.load(tmp_path / f"a-rank{rank}.pt", weights_only=False)
        resumed = torch.load(tmp_path / f"b-rank{rank}.pt", weights_only=False)
        # the run resumed from step 2 ends exactly where the uninterrupted one did, on every
        # rank: model, optimizer, env states, RNG, observations, normaliser carry
        _tensors_equal(straight["algo"], resumed["algo"], f"rank {rank}")
        assert straight["stats"] == resumed["stats"]
    a0, a1 = (torch.load(tmp_path / f"a-rank{r}.pt", weights_only=False)["algo"] for r in (0, 1))
    _tensors_equal(a0["policy"], a1["policy"])
    assert not torch.equal(a0["obs"]["tensor"], a1["obs"]["tensor"])

    # a checkpoint of 2 ranks cannot be resumed by another number of processes
    with pytest.raises(CheckpointError, match="run of 2 rank"):
        Trainer.from_checkpoint(tmp_path / "a" / files[0], tracking=False)


# --------------------------------------------------------------------------------------------
# (c) a rank that dies, raises or stalls ends the job with an error, never a hang


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["kill", "raise", "stall"])
def test_a_failing_rank_ends_the_job_with_an_error(tmp_path, mode):
    job = torchrun(
        [THIS_FILE, "fail", str(tmp_path), mode], timeout=120, env={"RL8_DIST_TIMEOUT_S": "5"}
    )
    assert job.returncode != 0, job.output
    assert job.seconds < 90, f"the job took {job.seconds:.0f} s to end"
    assert (tmp_path / "rank0-stepped").exists(), job.output  # training was under way
    if mode == "kill":
        assert "SIGKILL" in job.output, job.output
    elif mode == "raise":
        assert "RuntimeError: rank 1 fails on purpose" in job.output, job.output
    else:  # rank 0 gives up waiting for the stalled rank after RL8_DIST_TIMEOUT_S
        assert "rank 1 stalls on purpose" in job.output
        assert "within 5 s (RL8_DIST_TIMEOUT_S)" in job.output, job.output
    if mode != "raise":  # rank 0 says what went wrong
        assert "rl8.ppo.distributed.DistributedError: rank 0 of 2:" in job.output, job.output


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_simulation_per_rank_with_its_seed_and_device(tmp_path):
    """An rsl_rl VecEnv made by a factory, and a named task, on each rank: each sim gets the
    rank's seed and device, and data-parallel updates keep the ranks' weights equal."""
    from rl8.ppo.distributed import derive_seed

    job = torchrun([THIS_FILE, "sim_per_rank", str(tmp_path)])
    assert job.returncode == 0, job.output
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["factory"] for r in ranks] == [
        {"device": "cpu", "seed": 3},
        {"device": "cpu", "seed": derive_seed(3, 1)},
    ]
    assert [r["named_seeds"] for r in ranks] == [[3, 11], [derive_seed(3, 1), derive_seed(11, 1)]]
    assert ranks[1]["named_devices"] == ["cpu", "cpu"]
    assert not torch.equal(ranks[0]["sim_state"], ranks[1]["sim_state"])  # two simulations
    for name, tensor in ranks[0]["params"].items():
        torch.testing.assert_close(ranks[1]["params"][name], tensor, rtol=0, atol=0)


def test_rank_device_and_timeout_outside_torchrun(monkeypatch):
    from rl8.ppo.distributed import (
        DEFAULT_TIMEOUT_S,
        DistContext,
        _timeout_from_env,
        init_distributed,
        rank_device,
    )

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed() is False
    ctx = DistContext()
    assert (ctx.enabled, ctx.rank, ctx.world_size) == (False, 0, 1)
    assert ctx.max([1.0, 2.0]) == [1.0, 2.0]
    assert (
        ctx.broadcast_object("x") == "x"
        and ctx.gather_to_main(3) == [3]
        and ctx.scatter_from_main([4]) == 4
    )
    assert rank_device("auto") == "auto" and rank_device("cpu") == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_device("cpu") == "cpu"
    assert rank_device("auto") == ("cuda:1" if torch.cuda.is_available() else "auto")
    monkeypatch.delenv("RL8_DIST_TIMEOUT_S", raising=False)
    assert _timeout_from_env() == DEFAULT_TIMEOUT_S
    monkeypatch.setenv("RL8_DIST_TIMEOUT_S", "7.5")
    assert _timeout_from_env() == 7.5
    monkeypatch.setenv("RL8_DIST_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="RL8_DIST_TIMEOUT_S"):
        _timeout_from_env()


# --------------------------------------------------------------------------------------------
# workers (run by torchrun: python -m torch.distributed.run ... test_distributed.py NAME ARGS)


def _join() -> int:
    torch.set_num_threads(1)
    from rl8.ppo.distributed import DistContext, init_distributed

    assert init_distributed(), "run me with torchrun"
    ctx = DistContext()
    assert ctx.world_size == 2
    return ctx.rank


def _worker_one_update(out: str) -> None:
    rank = _join()
    from rl8 import PPO
    from rl8.envs import CartPole

    for name, optimizer in UPDATE_OPTIMIZERS.items():
        algo = PPO(CartPole, **UPDATE_HPARAMS, **optimizer)
        before = {k: v.clone() for k, v in algo.policy.state_dict().items()}
        rollout_stats = algo.collect()
        reward_stats = {k: v.clone() for k, v in algo.reward_normalizer.stats.state_dict().items()}
        data = algo.buffer.data.to_dict()
        update_stats = algo.update()
        torch.save(
            {
                "before": before,
                "after": dict(algo.policy.state_dict()),
                "data": data,
                "reward_stats": reward_stats,
                "rollout_stats": rollout_stats,
                "update_stats": update_stats,
            },
            Path(out) / f"{name}-rank{rank}.pt",
        )


def _worker_resume(out: str) -> None:
    rank = _join()
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.training.conditions import HitsUpperBound

    out_dir = Path(out)
    step = 2 * RESUME_HPARAMS["num_envs"] * RESUME_HPARAMS["horizon"]
    run = {"steps_per_eval": 1, "stop_conditions": HitsUpperBound("env/steps", 4 * step)}

    algo = PPO(CartPole, **RESUME_HPARAMS)
    trainer = Trainer(
        algo,
        tracking=False,
        progress=False,
        checkpoint_dir=out_dir / "a",
        eval_num_envs=4,
        eval_num_steps=16,
    )
    update = algo.update

    def update_then_signal():
        stats = update()
        if rank == 1 and algo.steps == 2:  # a signal to ONE rank checkpoints all of them
            os.kill(os.getpid(), signal.SIGUSR1)
        return stats

    algo.update = update_then_signal
    stats = trainer.run(**run)
    trainer.close()
    torch.save({"algo": algo.state_dict(), "stats": _comparable(stats)}, out_dir / f"a-rank{rank}.pt")

    resumed = Trainer.from_checkpoint(
        out_dir / "a" / f"checkpoint-{2 * step:012d}.pt",
        tracking=False,
        progress=False,
        checkpoint_dir=out_dir / "b",
    )
    stats = resumed.run(**run)
    resumed.close()
    torch.save(
        {"algo": resumed.algo.state_dict(), "stats": _comparable(stats)}, out_dir / f"b-rank{rank}.pt"
    )


def _comparable(stats) -> dict[str, float]:
    """Stats that two runs of the same computation report alike (no timings or memory)."""
    return {
        k: v
        for k, v in stats.items()
        if not k.startswith(("profiling/", "throughput/", "memory/")) and not math.isnan(v)
    }


def _worker_fail(out: str, mode: str) -> None:
    rank = _join()
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.training.conditions import HitsUpperBound

    algo = PPO(CartPole, num_envs=8, horizon=8, sgd_minibatch_size=32, seed=0, device="cpu")
    trainer = Trainer(algo, tracking=False, progress=False, checkpoint_dir=Path(out) / "ckpt")
    update = algo.update

    def update_then_fail():
        stats = update()
        if rank == 0:
            (Path(out) / "rank0-stepped").touch()
        if rank == 1 and algo.steps == 3:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "raise":
                raise RuntimeError("rank 1 fails on purpose")
            else:
                print("rank 1 stalls on purpose", flush=True)
                # a rank stuck outside Python's reach: torchrun's SIGTERM ends it at once
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                time.sleep(600)
        return stats

    algo.update = update_then_fail
    trainer.run(stop_conditions=HitsUpperBound("env/steps", 10**12))


def _worker_sim_per_rank(out: str) -> None:
    rank = _join()
    sys.path.insert(0, str(Path(THIS_FILE).parent / "envs"))
    from sim_fakes import PointMassVecEnv

    from rl8 import PPO
    from rl8.envs import tasks

    made = {}

    def make(device, seed):
        made.update(device=str(device), seed=seed)
        return PointMassVecEnv(8, max_episode_length=10, seed=seed, device=device)

    algo = PPO(make, horizon=8, seed=3)
    for _ in range(2):
        algo.collect()
        algo.update()
    tasks.TASK_PREFIXES["mjlab"] = "sim_fakes.make_point_mass"
    named = [
        PPO("mjlab:PointMass", num_envs=4, horizon=4, seed=3, env_kwargs=kw) for kw in ({}, {"seed": 11})
    ]
    torch.save(
        {
            "factory": made,
            "sim_state": algo.env.vec_env.state.clone(),
            "params": dict(algo.policy.state_dict()),
            "named_seeds": [p.env.vec_env.seed for p in named],
            "named_devices": [str(p.env.vec_env.device) for p in named],
        },
        Path(out) / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    _WORKERS = {
        "one_update": _worker_one_update,
        "resume": _worker_resume,
        "fail": _worker_fail,
        "sim_per_rank": _worker_sim_per_rank,
    }
    _WORKERS[sys.argv[1]](*sys.argv[2:])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ranks_whose_hparams_differ_are_refused_at_start_up(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import torch\nfrom rl8 import PPO\nfrom rl8.envs import CartPole\n"
        "from rl8.ppo.distributed import DistContext, init_distributed\n"
        "torch.set_num_threads(1)\ninit_distributed()\nrank = DistContext().rank\n"
        "PPO(CartPole, num_envs=8, horizon=8, sgd_minibatch_size=32, device='cpu', seed=0, lr=1e-3 * (1 + rank))\n"
        "print('trained on', rank)\n"
    )
    root = str(Path(__file__).resolve().parent.parent)
    job = torchrun([str(worker)], timeout=120, env={"PYTHONPATH": root})
    assert job.returncode != 0, job.output
    assert "the ranks' hparams differ: lr is '0.001' on rank 0 but '0.002' on rank 1" in job.output, (
        job.output
    )
    assert "trained on" not in job.output
