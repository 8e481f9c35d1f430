"""Trust, round three (issue 36): files, names, stores and servers that could mislead rl8."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest

from rl8.cli import main
from rl8.io.checkpoint_dir import CHECKPOINT_DIR_LOCK, CheckpointDirError, CheckpointDirLock


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_file_that_is_a_symlink_is_refused_and_never_followed(tmp_path, dangling):
    target = tmp_path / "precious.txt"
    if not dangling:
        target.write_text("keep me")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / CHECKPOINT_DIR_LOCK).symlink_to(target)
    with pytest.raises(CheckpointDirError, match="is a symbolic link, which rl8 never follows"):
        CheckpointDirLock(tmp_path / "ck")
    assert target.read_text() == "keep me" if not dangling else not target.exists()


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "ck").mkdir()
    os.mkfifo(tmp_path / "ck" / CHECKPOINT_DIR_LOCK)
    with pytest.raises(CheckpointDirError, match="is not a regular file"):
        CheckpointDirLock(tmp_path / "ck")


def _run_with_pointer(content: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run = client.create_run(client.create_experiment("pointers")).info.run_id
    Path("checkpoint.json").write_text(content)
    client.log_artifact(run, "checkpoint.json", "rl8")
    return run


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "must be a JSON object"),
        ('["a"]', "must be a JSON object"),
        (
            '{"path": "../elsewhere/checkpoint-000000000001.pt"}',
            "absolute path of a checkpoint, without '..'",
        ),
        ('{"path": "/tmp/../etc/checkpoint-000000000001.pt"}', "without '..'"),
        ("[" * 100000 + "]" * 100000, "must be a JSON object"),
    ],
    ids=["not-json", "a-list", "relative", "dotdot", "deep"],
)
def test_a_malformed_or_escaping_checkpoint_pointer_is_refused(migrated_store, content, words):
    from rl8 import Trainer
    from rl8.io.checkpoint import CheckpointError

    run = _run_with_pointer(content)
    with pytest.raises(CheckpointError, match=re.escape(words)):
        Trainer.from_checkpoint(run)


def test_a_pointer_to_another_runs_checkpoint_is_refused(migrated_store, tmp_path, capsys):
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.io.checkpoint import CheckpointError

    with Trainer(
        PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16),
        tracking=False,
        progress=False,
        checkpoint_dir=tmp_path / "other",
    ) as trainer:
        written = trainer.save_checkpoint()
    run = _run_with_pointer(json.dumps({"path": str(written), "env/steps": 0}))
    with pytest.raises(
        CheckpointError, match=f"points at the checkpoint {written}, which belongs to run None"
    ):
        Trainer.from_checkpoint(run)
    assert main(["train", "--resume", run]) != 0
    assert "rl8 refused to resume another run into it" in capsys.readouterr().err


def test_rl8_record_never_writes_over_a_file_that_is_not_a_video(tmp_path, capsys):
    from rl8 import Policy
    from rl8.envs import CartPole
    from rl8.io.export import save_policy

    env = CartPole(1)
    policy = save_policy(
        Policy(env.observation_space, env.action_space),
        tmp_path / "policy.pt",
        env={"spec": "rl8.envs.cartpole.CartPole", "env_kwargs": {}, "env_config": {}},
    )
    before = policy.read_bytes()
    (tmp_path / "ckpt.pt").write_bytes(b"PK\x03\x04 a checkpoint")
    for output in (str(policy), str(tmp_path / "ckpt.pt")):
        assert main(["record", str(policy), "-o", output]) == 2
        assert (
            f"{output} exists and is not an MP4 video; rl8 refused to write over it (--force"
            in capsys.readouterr().err
        )
    assert (
        policy.read_bytes() == before
        and (tmp_path / "ckpt.pt").read_bytes() == b"PK\x03\x04 a checkpoint"
    )
    for output, words in (("", "got ''"), (str(tmp_path), "(a folder)")):
        assert main(["record", str(policy), "-o", output]) == 2
        err = capsys.readouterr().err
        assert (
            "-o/--output must name an MP4 file to write" in err and words in err and err.count("\n") == 1
        )
    pytest.importorskip("imageio_ffmpeg")
    assert (
        main(["record", str(policy), "-o", str(tmp_path / "ckpt.pt"), "--force", "--max-steps", "2"])
        == 0
    )
    assert (tmp_path / "ckpt.pt").read_bytes()[4:8] == b"ftyp"
    assert (
        main(["record", str(policy), "-o", str(tmp_path / "ckpt.pt"), "--max-steps", "2"]) == 0
    )  # ours now


def test_an_empty_run_name_is_refused_before_anything_starts(tmp_path, capsys):
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole

    with pytest.raises(SystemExit, match="2"):
        main(["train", "--env", "CartPole", "--run-name", ""])
    assert "run_name must be a non-empty string or None, got ''" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match="run_name must be a non-empty string"):
        Trainer(
            PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16), run_name=" ", tracking=False
        )


def test_sizes_that_could_never_fit_are_refused_before_allocating(tmp_path, capsys):
    from rl8 import PPO, Trainer, save_policy
    from rl8.envs import CartPole

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


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "/dev/zero"],
        ["record", "/dev/zero", "-o", "v.mp4"],
        ["train", "--resume", "/dev/zero"],
        ["train", "/dev/zero"],
    ],
)
def test_files_that_are_not_regular_files_are_refused_not_read_forever(capsys, command):
    assert main(command) in (1, 2)
    assert "/dev/zero is not a regular file" in capsys.readouterr().err


def test_a_config_that_is_too_large_or_not_utf8_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "big.yaml").write_text("a: 1\n" * 300_000)
    (tmp_path / "bad.yaml").write_bytes(b"env: \xff\n")
    assert main(["train", "big.yaml"]) == 2
    assert "is larger than 1048576 bytes" in capsys.readouterr().err
    assert main(["train", "bad.yaml"]) == 2
    assert "bad.yaml: not UTF-8 text (invalid start byte at byte 5)" in capsys.readouterr().err


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
    from rl8.registry import lookup

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
    import torch

    from rl8.registry import lookup

    found = lookup(name)
    assert isinstance(found, type) and found.__name__ == name.rpartition(".")[2]
    assert found is getattr(torch.nn if ".nn." in name else torch.optim, found.__name__)


@pytest.mark.parametrize("where", ["a-file/mlflow.db", "a-folder"])
def test_a_sqlite_store_that_cannot_be_opened_fails_at_the_first_step(tmp_path, where):
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.tracking import TrackingError

    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder").mkdir()
    algo = PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16)
    trainer = Trainer(algo, tracking_uri=f"sqlite:///{tmp_path / where}", progress=False)
    with pytest.raises(TrackingError, match=r"\) cannot be opened and written: .*Give a writable place"):
        trainer.run(max_env_steps=10**9, max_seconds=120)  # MLflow alone: minutes of retries
    assert algo.env_steps <= 16 * 3


@pytest.fixture
def silent_server(monkeypatch):
    """The URI of a server on 127.0.0.1 that accepts connections and never answers; the read
    policy shortened to 1 s a request, no retry (the mechanism, not MLflow's 7 x 120 s)."""
    import socket
    import threading

    import rl8.mlflow_http

    monkeypatch.setattr(rl8.mlflow_http, "LOG_TIMEOUT_S", 1)
    monkeypatch.setattr(rl8.mlflow_http, "LOG_RETRIES", 0)
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for conn in held:
        conn.close()


def _returns_within(seconds, call):
    import threading

    done = threading.Event()
    outcome = []

    def target():
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the outcome is inspected below
            outcome.append(exc)
        done.set()

    threading.Thread(target=target, daemon=True).start()
    assert done.wait(seconds), f"still waiting on a silent tracking server after {seconds} s"
    return outcome[0]


def test_reading_a_run_by_id_from_a_silent_server_is_bounded(silent_server):
    from rl8 import load_policy

    run = "a" * 32
    assert isinstance(
        _returns_within(60, lambda: load_policy(run, tracking_uri=silent_server)), Exception
    )
    for command in (["eval", run], ["record", run, "-o", "v.mp4"], ["train", "--resume", run], ["runs"]):
        code = _returns_within(60, lambda: main([*command, "--tracking-uri", silent_server]))
        assert code in (1, 2), (command, code)


def test_loading_a_model_uri_from_a_silent_server_is_bounded(silent_server):
    from rl8 import load_policy

    for ref in ("models:/m-" + "a" * 32, "models:/cartpole-ppo/1", "models:/cartpole-ppo@best"):
        outcome = _returns_within(60, lambda: load_policy(ref, tracking_uri=silent_server))
        assert isinstance(outcome, FileNotFoundError), (ref, outcome)
        assert "cannot download" in str(outcome)
    code = _returns_within(
        60, lambda: main(["eval", "models:/cartpole-ppo@best", "--tracking-uri", silent_server])
    )
    assert code in (1, 2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ranks_whose_hparams_differ_are_refused_at_start_up(tmp_path):
    from launch import torchrun

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


def _lock_record(folder: Path, **record) -> None:
    folder.mkdir(exist_ok=True)
    (folder / CHECKPOINT_DIR_LOCK).write_text(json.dumps({"run_id": "r" * 32, "since": 0.0, **record}))


@pytest.mark.parametrize(
    "content",
    ["[" * 100_000 + "]" * 100_000, '{"pid": 1' + " " * 5000 + "}", "{not json"],
    ids=["deep", "long", "not-json"],
)
def test_a_lock_file_that_holds_no_rl8_record_is_taken_over_with_one_line(tmp_path, content):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / CHECKPOINT_DIR_LOCK).write_text(content)
    with pytest.warns(
        UserWarning, match=r"was locked by an unknown run \(the lock file holds no record of rl8's\)"
    ):
        lock = CheckpointDirLock(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / CHECKPOINT_DIR_LOCK).read_text())["pid"] == os.getpid()
    lock.release()


@contextlib.contextmanager
def _held_by_another_process(lock: Path):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, time\n"
            f"fcntl.flock(os.open({str(lock)!r}, os.O_RDWR), fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("released", [True, False])
def test_a_lock_held_by_a_live_process_that_is_not_the_named_run_says_so(tmp_path, released):
    import socket

    folder = tmp_path / "ck"
    # a run that released the folder, or one that ended long ago (past Linux's default pid_max)
    _lock_record(
        folder, pid=os.getpid() if released else 2**22 - 1, host=socket.gethostname(), released=released
    )
    with (
        _held_by_another_process(folder / CHECKPOINT_DIR_LOCK),
        pytest.raises(CheckpointDirError) as raised,
    ):
        CheckpointDirLock(folder)
    fate = ", ended))" if released else "), which has ended)"
    assert f"is locked by a live process (not the one its lock file names, run {'r' * 32} (pid" in str(
        raised.value
    )
    assert f"{fate}; rl8 never writes into a folder another process holds" in str(raised.value)
    assert "is in use by" not in str(raised.value)
    (folder / CHECKPOINT_DIR_LOCK).write_text("[1]")
    with (
        _held_by_another_process(folder / CHECKPOINT_DIR_LOCK),
        pytest.raises(
            CheckpointDirError,
            match=r"is locked by a live process \(its lock file holds no record of rl8's\)",
        ),
    ):
        CheckpointDirLock(folder)


@pytest.mark.parametrize(
    "where, fate",
    [
        ("alive", "whose process is alive but no longer holds the lock"),
        (
            "elsewhere",
            r"which no longer holds the lock \(whether its process still runs is not known here\)",
        ),
        ("ended", r"whose process ended without releasing it \(killed or crashed\)"),
    ],
)
def test_a_lock_taken_over_says_what_is_known_of_its_owner(tmp_path, where, fate):
    import socket

    pid = {"alive": os.getppid(), "elsewhere": os.getppid(), "ended": 2**22 - 1}[where]
    host = "another-host" if where == "elsewhere" else socket.gethostname()
    _lock_record(tmp_path / "ck", pid=pid, host=host, released=False)
    with pytest.warns(
        UserWarning,
        match=rf"was locked by run r{{32}} \(pid {pid} on {host}\), {fate}; this run takes it over",
    ):
        CheckpointDirLock(tmp_path / "ck").release()


@pytest.mark.parametrize("uri", ["file:///{tmp}/store", "{tmp}/store", "./mlruns"])
def test_a_folder_tracking_uri_is_told_what_to_use_not_to_start_a_server(tmp_path, uri):
    from rl8.tracking import Tracker, TrackingError

    uri = uri.format(tmp=tmp_path)
    for start in (
        lambda: Tracker(experiment="x", tracking_uri=uri).start(),
        lambda: Tracker(experiment="x", tracking_uri=uri, run_id="a" * 32).start(),
    ):
        with pytest.raises(TrackingError) as raised:
            start()
        assert "MLflow 3 refuses folder stores" in str(raised.value)
        assert "sqlite:///PATH/mlflow.db (a file), or a server's http://HOST:PORT" in str(raised.value)
        assert "Start the server" not in str(raised.value)


@pytest.mark.parametrize(
    "field, value, words",
    [
        (
            "optimizer_cls",
            "torch.optim.Optimizer",
            "hparam optimizer_cls = 'torch.optim.Optimizer', which is the class "
            "torch.optim.optimizer.Optimizer, not a torch.optim.Optimizer subclass",
        ),
        (
            "optimizer_cls",
            "torch.optim.LBFGS",
            "do not build: hparam optimizer_kwargs: torch.optim.lbfgs.LBFGS refused "
            "{'eps': 1e-05} (LBFGS.__init__() got an unexpected keyword argument 'eps')",
        ),
        (
            "optimizer_kwargs",
            {"betas": "x"},
            "hparam optimizer_kwargs: torch.optim.adam.Adam refused {'betas': 'x'}",
        ),
        (
            "model_config",
            {"hiddens": "abc"},
            "model_config hiddens: expected a sequence of ints >= 1, got 'abc'",
        ),
        (
            "env_kwargs",
            {"env": "CartPole-v1", "wrappers": ["gymnasium.wrappers.ClipAction"]},
            "env env_kwargs['wrappers'] must be empty or None in a file (a wrapper is a callable, which a file cannot hold)",
        ),
    ],
)
def test_resuming_stored_hparams_that_do_not_build_is_one_line(tmp_path, capsys, field, value, words):
    from rl8 import PPO, Trainer
    from rl8.envs import GymnasiumEnv
    from rl8.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    algo = PPO(
        GymnasiumEnv, env_kwargs={"env": "CartPole-v1"}, num_envs=2, horizon=4, sgd_minibatch_size=8
    )
    with Trainer(algo, tracking=False, progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        state = load_checkpoint(trainer.save_checkpoint())
    state["algo"]["hparams"][field] = value
    bad = save_checkpoint(state, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=re.escape(f"{bad}: ") + ".*" + re.escape(words)):
        Trainer.from_checkpoint(bad, tracking=False, progress=False, checkpoint_dir=tmp_path / "again")
    assert main(["train", "--resume", str(bad), "--checkpoint-dir", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl8: error: ") and words in err and err.count("\n") == 1, err


def test_log_every_logs_every_nth_step_the_evaluations_checkpoints_and_the_last(
    tmp_path, migrated_store
):
    from mlflow.tracking import MlflowClient

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole

    with pytest.raises(ValueError, match="Trainer: log_every must be an int >= 1 or None, got 0"):
        Trainer(PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16), log_every=0, tracking=False)
    algo = PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16, seed=0)
    with Trainer(
        algo,
        log_every=4,
        log_models="all",  # both checkpoints, though no evaluation ranks them
        checkpoint_every=7,
        eval_num_envs=2,
        eval_num_steps=4,
        progress=False,
        checkpoint_dir=tmp_path / "ck",
    ) as trainer:
        trainer.run(max_env_steps=16 * 11, steps_per_eval=5)
        run_id = trainer.run_id
    client = MlflowClient()
    history = lambda run, key: sorted(m.step // 16 for m in client.get_metric_history(run, key))  # noqa: E731
    # every 4th step (4, 8); the evaluations (5, 10); checkpoint 7; the last (11)
    assert history(run_id, "env/steps") == [4, 5, 7, 8, 10, 11]
    assert history(run_id, "eval/episodes/count") == [5, 10]
    values = {m.step // 16: m.value for m in client.get_metric_history(run_id, "algorithm/steps")}
    assert values == {s: float(s) for s in [4, 5, 7, 8, 10, 11]}
    models = {
        m.name: {x.key for x in m.metrics}
        for m in client.search_logged_models([client.get_run(run_id).info.experiment_id])
    }
    assert (
        "losses/total" in models["checkpoint-112"] and "losses/total" in models["checkpoint-176"]
    )  # linked
    with Trainer(
        PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16, seed=0),
        log_every=4,
        progress=False,
        checkpoint_dir=tmp_path / "steps",
    ) as trainer:
        for _ in range(6):
            trainer.step()
    assert history(trainer.run_id, "env/steps") == [4, 6]  # the last step at close


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_signals_checkpoint_never_waits_for_a_run_start_that_hangs(tmp_path, monkeypatch, capsys):
    import signal
    import threading

    from mlflow.tracking import MlflowClient

    import rl8.tracking.store
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.io.checkpoint import load_checkpoint

    release, ready_store = threading.Event(), rl8.tracking.store.ready_store
    # the store's creation hangs (another process creating it, MLflow retrying an engine) until released
    monkeypatch.setattr(
        rl8.tracking.store, "ready_store", lambda uri: (release.wait(60), ready_store(uri))
    )
    trainer = Trainer(PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16), progress=False)

    def sigterm_at_step_2(trainer, stats):
        if stats["algorithm/steps"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit, match="143"):
        trainer.run(max_env_steps=10**6, callbacks=sigterm_at_step_2)
    assert not release.is_set() and trainer.tracker.run_id is None  # written while the start still hangs
    written = trainer.last_checkpoint
    assert (
        written.parent.parent == tmp_path / "checkpoints" and written.name == f"checkpoint-{32:012d}.pt"
    )
    assert load_checkpoint(written)["trainer"]["run_id"] is None
    assert (
        "the MLflow run was still starting: it is marked KILLED once started" in capsys.readouterr().err
    )
    release.set()
    assert trainer.tracker.wait_started(30) and trainer.tracker.run_id is not None
    assert MlflowClient().get_run(trainer.tracker.run_id).info.status == "KILLED"
