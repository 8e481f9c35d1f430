"""Actors and learners (``rl8 train --actors N``): some ranks of a torchrun job only collect
(:func:`run_actor`), the others only update (:class:`Learner`); see ``docs/distributed.md``."""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from tensordict import TensorDictBase

from rl8.ppo.distributed import (
    TIMEOUT_ENV_VAR,
    DistContext,
    DistributedError,
    Roles,
    collective_timeout_s,
    current_roles,
    to_cpu,
)
from rl8.ppo.stats import Stats, episode_means, reduce_stats
from rl8.training.resume import rank_entry
from rl8.training.signals import handling, signal_exit

if TYPE_CHECKING:
    from rl8.ppo.algorithm import PPO
    from rl8.ppo.buffer import RolloutBuffer
    from rl8.training.config import TrainerConfig

__all__ = [
    "HEADER",
    "FlatLayout",
    "Learner",
    "actor_state",
    "check_actor_config",
    "run_actor",
    "truncated_importance_weights",
]

#: The fields of the ``float64`` header an actor sends before each rollout.
HEADER = (
    "version",  # learner update count of the weights that collected the rollout
    "episode_return_sum",
    "episode_length_sum",
    "episode_count",  # episodes that ended in it
    "env_records",  # 1: the actor's env records episodes itself (the next three), 0: it does not
    "env_episode_return_sum",
    "env_episode_length_sum",
    "env_episode_count",  # as the env recorded them
    "collect_s",  # seconds the actor spent collecting it
    "wait_s",  # seconds the actor waited for its learner before collecting it
    "env_steps",  # transitions in it
)

# reply commands (learner -> actor), a float64 pair [command, version]; _STATE: send your state
# (for a checkpoint), then wait for the next reply
_GO_ON, _WEIGHTS, _STOP, _STATE = 0.0, 1.0, 2.0, 3.0
# point-to-point tags, so that a header and a rollout can never be mistaken for each other
_TAG_HEADER, _TAG_ROLLOUT, _TAG_REPLY, _TAG_WEIGHTS, _TAG_STATE_SIZE, _TAG_STATE = 1, 2, 3, 4, 5, 6
_WEIGHTS_FILE = "weights.pt"
_POLL_S = 0.02  # seconds between two reads of the weights file


class FlatLayout:
    """A fixed layout of ``tensors`` (``{name: tensor}``: only their names, shapes and dtypes are
    kept) in one contiguous byte tensor of ``nbytes`` bytes, for point-to-point sends: each tensor
    at an offset aligned to 8 bytes, in the mapping's order, so that two processes with tensors of
    the same names, shapes and dtypes agree on it without exchanging it."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.fields: list[
            tuple[str, torch.Size, torch.dtype, int, int]
        ] = []  # name, shape, dtype, offset, bytes
        offset = 0
        for name, t in tensors.items():
            size = t.numel() * t.element_size()
            self.fields.append((name, t.shape, t.dtype, offset, size))
            offset += -(-size // 8) * 8
        self.nbytes = offset

    def empty(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """A byte tensor of this layout."""
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def _views(self, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        for name, shape, dtype, offset, size in self.fields:
            yield name, flat[offset : offset + size].view(dtype).view(shape)

    def pack(self, tensors: Mapping[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Copy ``tensors`` (the names of the layout) into the byte tensor ``out``; returns it."""
        for name, view in self._views(out):
            view.copy_(tensors[name])
        return out

    def unpack(self, flat: torch.Tensor, into: Mapping[str, torch.Tensor]) -> None:
        """Copy the packed ``flat`` into the tensors ``into`` (in place)."""
        for name, view in self._views(flat):
            into[name].copy_(view)


def _leaves(td: TensorDictBase) -> dict[str, torch.Tensor]:
    """A TensorDict's tensors (views, not copies) by their nested key joined with ``/``."""
    return dict(td.flatten_keys("/").items())


def check_actor_config(config: TrainerConfig, algo: PPO, roles: Roles | None) -> None:
    """A ``ValueError`` when the Trainer's ``actors`` option differs from the job's ``roles``,
    or ``algo`` is recurrent or not PPO (neither is supported with actors)."""
    have = roles.actors if roles is not None else None
    if config.actors != have:
        how = (
            f"init_distributed(actors={config.actors}) before building PPO (rl8 train --actors "
            f"{config.actors} under torchrun)"
            if config.actors is not None
            else "no actors"
        )
        raise ValueError(
            f"Trainer: actors={config.actors!r} but the process group was set up with actors={have!r}; "
            f"call {how}"
        )
    if roles is not None and algo.recurrent:
        raise ValueError(
            "Trainer: actors: recurrent models are not supported with actors and learners yet"
        )
    if roles is not None and algo.algorithm != "PPO":  # the learners' importance weights are PPO's
        raise ValueError(
            f"Trainer: actors: actors and learners train PPO only, got {algo.algorithm} (train it "
            "without --actors, or data-parallel under torchrun)"
        )


@contextlib.contextmanager
def _p2p(peer: int, what: str) -> Iterator[None]:
    """A failed point-to-point transfer with rank ``peer`` as an error naming both ranks."""
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, DistributedError):
            raise
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DistributedError(
            f"{what} failed: rank {peer} died, raised an error, or stalled past "
            f"{collective_timeout_s():g} s ({TIMEOUT_ENV_VAR}); see its output for the cause. Backend error: {cause}"
        ) from exc


def _weights(algo: PPO) -> dict[str, torch.Tensor]:
    return dict(algo.policy.state_dict())


def actor_state(algo: PPO) -> dict[str, Any]:
    """An actor's own state as a checkpoint holds it (its entry in ``actors``), on the CPU: the
    per-rank part of ``algo.state_dict()`` and its own ``counters``."""
    state = algo.state_dict()
    return to_cpu({**rank_entry(state), "counters": state["counters"]})


def _send_state(algo: PPO, learner: int, rank: int) -> None:
    """Send :func:`actor_state` to the learner: its size, then the bytes of ``torch.save``."""
    buffer = io.BytesIO()
    torch.save(actor_state(algo), buffer)
    data = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
    with _p2p(learner, f"actor rank {rank}: sending its state to learner rank {learner}"):
        dist.send(torch.tensor([data.numel()], dtype=torch.int64), learner, tag=_TAG_STATE_SIZE)
        dist.send(data, learner, tag=_TAG_STATE)


def run_actor(algo: PPO, config: TrainerConfig, *, env_config: dict[str, Any] | None = None) -> Stats:
    """The actor's loop, with its own ``algo`` (its envs, its policy copy; never updated) and the
    Trainer's options ``config``: wait for its learner's reply, load the weights it sends, collect
    one rollout (``env_config``: env parameters of its resets), send it; until the learner says
    stop (asked for its state, it sends it). Returns the stats of its last collect (empty if it
    collected nothing). SIGINT and SIGTERM wait for the learners to stop the job, then exit with
    the signal's status."""
    roles = current_roles()
    assert roles is not None and roles.is_actor
    rank, learner = roles.rank, roles.learner_of(roles.rank)
    layout = FlatLayout(_leaves(algo.buffer.data))
    payload = layout.empty(algo.device)
    weights_layout = FlatLayout(_weights(algo))
    weights = weights_layout.empty(algo.device)
    reply = torch.zeros(2, dtype=torch.float64)
    stats, received_signal = Stats(), [None]

    def on_signal(signum: int, frame: Any) -> None:
        received_signal[0] = signum

    with contextlib.closing(algo), handling([signal.SIGINT, signal.SIGTERM], on_signal):
        while True:
            t0 = time.perf_counter()
            with _p2p(learner, f"actor rank {rank}: waiting for learner rank {learner}'s reply"):
                dist.recv(reply, src=learner, tag=_TAG_REPLY)
            command, version = reply.tolist()
            if command == _STOP:
                break
            if command == _STATE:  # for a checkpoint: at this rollout boundary
                _send_state(algo, learner, rank)
                continue
            if (
                command == _WEIGHTS
            ):  # the learner's weights of this version: sent, or in the weights file
                if config.weight_sync == "broadcast":
                    with _p2p(
                        learner, f"actor rank {rank}: receiving weights from learner rank {learner}"
                    ):
                        dist.recv(weights, src=learner, tag=_TAG_WEIGHTS)
                    weights_layout.unpack(weights, _weights(algo))
                else:
                    _load_weights_file(algo, Path(config.weight_sync_dir), int(version))
                algo.updates = int(version)
            t1 = time.perf_counter()
            stats = algo.collect(env_config=env_config)
            header = _rollout_header(algo, stats, wait_s=t1 - t0, collect_s=time.perf_counter() - t1)
            with _p2p(learner, f"actor rank {rank}: sending a rollout to learner rank {learner}"):
                dist.send(
                    torch.tensor([header[k] for k in HEADER], dtype=torch.float64),
                    learner,
                    tag=_TAG_HEADER,
                )
                dist.send(layout.pack(_leaves(algo.buffer.data), payload), learner, tag=_TAG_ROLLOUT)
    if received_signal[0] is not None:
        raise signal_exit(received_signal[0])
    return stats


def _rollout_header(algo: PPO, stats: Stats, *, wait_s: float, collect_s: float) -> dict[str, float]:
    """The header sent with a rollout (the keys of ``HEADER``)."""
    count = stats.get("episodes/count", 0.0)
    count = 0.0 if math.isnan(count) else count
    records = algo.buffer.env_episodes  # the env's own records of the rollout (or None)
    return {
        "version": algo.behaviour_version,
        "episode_return_sum": stats.get("episodes/return_mean", 0.0) * count if count else 0.0,
        "episode_length_sum": stats.get("episodes/length_mean", 0.0) * count if count else 0.0,
        "episode_count": count,
        "env_records": float(records is not None),
        "env_episode_return_sum": records.return_sum if records is not None else 0.0,
        "env_episode_length_sum": records.length_sum if records is not None else 0.0,
        "env_episode_count": float(records.count) if records is not None else 0.0,
        "collect_s": collect_s,
        "wait_s": wait_s,
        "env_steps": algo.hparams.batch_size,
    }


def _load_weights_file(algo: PPO, folder: Path, version: int) -> None:
    """Wait until ``folder``'s weights file holds ``version`` or a later one, and load it."""
    path = folder / _WEIGHTS_FILE
    deadline = time.monotonic() + collective_timeout_s()
    while True:
        state = None
        with contextlib.suppress(FileNotFoundError, EOFError, RuntimeError):
            state = torch.load(path, weights_only=True, map_location=algo.device)
        if (
            isinstance(state, dict)
            and isinstance(state.get("version"), int)
            and state["version"] >= version
        ):
            policy = state.get("policy")
            if not isinstance(policy, dict) or not all(
                isinstance(v, torch.Tensor) for v in policy.values()
            ):
                raise ValueError(f"{path}: expected {{'version': int, 'policy': {{name: tensor}}}}")
            algo.policy.load_state_dict(policy)
            return
        if time.monotonic() > deadline:
            raise DistributedError(
                f"weight_sync='checkpoint': {path} did not get weights of version {version} within "
                f"{collective_timeout_s():g} s ({TIMEOUT_ENV_VAR}); is weight_sync_dir on storage every rank sees?"
            )
        time.sleep(_POLL_S)


@torch.no_grad()
def truncated_importance_weights(algo: PPO, cap: float) -> torch.Tensor:
    """Prepare the next update of the learner's ``algo`` (its buffer filled, a feedforward model)
    for rollouts collected with older weights, as decoupled PPO does (Hilton et al., 2021): the
    buffer's ``logp`` become those of its actions under the current weights (the proximal
    policy), and :attr:`rl8.PPO.advantage_weights` the truncated importance weights
    ``min(cap, pi_prox(a|s) / mu(a|s))`` of the behaviour policy (``[num_envs, horizon]``, also
    returned), ``cap`` (``rho_bar``) > 0."""
    h = algo.hparams.horizon
    zeros = torch.zeros(algo.hparams.num_envs, h, device=algo.device)
    samples = algo.buffer.training_samples(zeros, zeros)
    proximal = algo.policy.evaluate(samples, entropy_grad=False)[0].float().reshape(zeros.shape)
    behaviour = algo.buffer.data["logp"][:, :h]
    weights = (proximal - behaviour).exp().clamp(max=cap)
    behaviour.copy_(proximal)
    algo.advantage_weights = weights
    return weights


class Learner:
    """The learner's side of the exchange with its ``actors`` (their ranks, by slot), one per
    learner rank: its ``algo``'s buffer holds one rollout of each of them; ``config`` holds the
    Trainer's options (``max_staleness``, ``weight_sync_interval``, ``weight_sync``,
    ``weight_sync_dir``). ``dropped`` counts the rollouts dropped as too stale so far,
    ``received_steps`` the transitions received (dropped ones included)."""

    def __init__(self, algo: PPO, config: TrainerConfig) -> None:
        roles = current_roles()
        assert roles is not None and not roles.is_actor
        self.algo, self.config, self.roles = algo, config, roles
        self.dist: DistContext = algo.dist
        self.actors = roles.actors_of(roles.rank)
        self.rows = algo.hparams.num_envs // len(self.actors)  # envs per actor
        self.layout = FlatLayout(_leaves(algo.buffer.data[: self.rows]))
        self.staging = {a: self.layout.empty(algo.device) for a in self.actors}
        self.weights_layout = FlatLayout(_weights(algo))
        self._weights = self.weights_layout.empty(algo.device)
        self.actor_version = {a: -1 for a in self.actors}  # version of the weights each actor holds
        self.awaiting_reply = {a: False for a in self.actors}
        # headers of the rollouts received for a checkpoint (in staging), for the next collect
        self._held: dict[int, torch.Tensor] = {}
        self.started = self.stopped = False
        self.dropped = 0
        self.received_steps = 0
        self._actor_rates: dict[int, float] = {}

    def _reply(self, actor: int, *, weights: bool, stop: bool = False) -> None:
        version = self.algo.updates
        command = _STOP if stop else _WEIGHTS if weights else _GO_ON
        with _p2p(actor, f"learner rank {self.roles.rank}: replying to actor rank {actor}"):
            dist.send(
                torch.tensor([command, float(version)], dtype=torch.float64), actor, tag=_TAG_REPLY
            )
            if weights and self.config.weight_sync == "broadcast":
                self.weights_layout.pack(_weights(self.algo), self._weights)
                dist.send(self._weights, actor, tag=_TAG_WEIGHTS)
        if weights:
            self.actor_version[actor] = version
        self.awaiting_reply[actor] = False

    def _publish_weights(self) -> None:
        """With ``weight_sync="checkpoint"``, rank 0 writes the weights and their version atomically
        to the weights file."""
        if self.config.weight_sync == "checkpoint" and self.dist.is_main:
            folder = Path(self.config.weight_sync_dir)
            folder.mkdir(parents=True, exist_ok=True)
            weights = {k: v.cpu() for k, v in _weights(self.algo).items()}
            torch.save(
                {"version": int(self.algo.updates), "policy": weights}, folder / f".{_WEIGHTS_FILE}.tmp"
            )
            os.replace(folder / f".{_WEIGHTS_FILE}.tmp", folder / _WEIGHTS_FILE)

    def start(self) -> None:
        """Send every actor of this learner the current weights (its first reply)."""
        if self.started:
            return
        self._publish_weights()
        for actor in self.actors:
            self._reply(actor, weights=True)
        self.started = True

    def _waits_for_reply(self, actor: int) -> bool:
        """Whether ``actor`` waits for a reply (else it is collecting, or sending, a rollout)."""
        return not self.started or self.awaiting_reply[actor] or actor in self._held

    def _receive(self, actor: int) -> torch.Tensor:
        header = torch.zeros(len(HEADER), dtype=torch.float64)
        with _p2p(actor, f"learner rank {self.roles.rank}: receiving a rollout from actor rank {actor}"):
            dist.recv(header, src=actor, tag=_TAG_HEADER)
            dist.recv(self.staging[actor], src=actor, tag=_TAG_ROLLOUT)
        return header

    def collect(self, env_config: dict[str, Any] | None = None) -> Stats:
        """Receive one fresh rollout from each actor into the buffer; the collect's stats
        (PPO's, the actors' episodes, and those of ``docs/distributed.md``)."""
        self.start()
        version, cfg = self.algo.updates, self.config
        fresh: dict[int, float] = {}  # actor -> lag of its rollout in this batch
        sums = dict.fromkeys(
            (
                "episode_return_sum",
                "episode_length_sum",
                "episode_count",
                "env_records",
                "env_episode_return_sum",
                "env_episode_length_sum",
                "env_episode_count",
            ),
            0.0,
        )
        actor_waits, wait_s = [], 0.0
        while len(fresh) < len(self.actors):
            for actor in self.actors:
                if actor in fresh:
                    continue
                t0 = time.perf_counter()
                received = self._held.pop(actor) if actor in self._held else self._receive(actor)
                header = dict(zip(HEADER, received.tolist()))
                wait_s += time.perf_counter() - t0
                for key in sums:
                    sums[key] += header[key]
                actor_waits.append(header["wait_s"])
                self.received_steps += int(header["env_steps"])
                self._actor_rates[actor] = header["env_steps"] / max(header["collect_s"], 1e-9)
                lag = version - header["version"]
                if lag > cfg.max_staleness:  # collected with weights too old: drop, send new ones
                    self.dropped += 1
                    self._reply(actor, weights=True)
                    continue
                fresh[actor] = lag
                held = self.actor_version[actor]
                # its next rollout (with the weights it holds) is used after this update at the earliest
                if version + 1 - held <= cfg.max_staleness:
                    self._reply(actor, weights=version - held >= cfg.weight_sync_interval)
                else:
                    self.awaiting_reply[actor] = True

        def fill(buffer: RolloutBuffer) -> None:
            for slot, actor in enumerate(self.actors):
                rows = buffer.data[slot * self.rows : (slot + 1) * self.rows]
                self.layout.unpack(self.staging[actor], _leaves(rows))

        stats = self.algo.collect_received(fill)
        if cfg.importance_weight_cap is not None:
            weights = truncated_importance_weights(self.algo, cfg.importance_weight_cap)
            stats["monitors/importance_weight_mean"] = reduce_stats(
                self.dist, means={"w": weights.double().mean()}
            )["w"]
        self._add_actor_stats(stats, sums, fresh, actor_waits, wait_s)
        return stats

    def _add_actor_stats(
        self,
        stats: Stats,
        sums: dict[str, float],
        fresh: dict[int, float],
        actor_waits: list[float],
        wait_s: float,
    ) -> None:
        """Reduce the actors' numbers over the learners into ``stats``: their episodes' ``sums``,
        the lag of each ``fresh`` rollout, the actors' waits and this learner's ``wait_s`` (s)."""
        counts = {
            "actors/dropped_rollouts": float(self.dropped),
            "actors/env_steps": float(self.received_steps),
            "throughput/actor_env_steps_per_s": sum(self._actor_rates.values()),
        }
        means = {
            "monitors/policy_lag": sum(fresh.values()) / len(fresh),
            "profiling/actor_wait_ms": 1000.0 * sum(actor_waits) / len(actor_waits),
            "profiling/learner_wait_ms": 1000.0 * wait_s,
        }
        f64 = torch.float64
        reduced = reduce_stats(
            self.dist,
            sums={k: torch.tensor(v, dtype=f64) for k, v in {**sums, **counts}.items()},
            means={k: torch.tensor(v, dtype=f64) for k, v in means.items()},
        )
        stats.update(
            episode_means(
                "episodes/",
                reduced["episode_return_sum"],
                reduced["episode_length_sum"],
                reduced["episode_count"],
            )
        )
        if reduced["env_records"]:  # the actors' envs record episodes themselves
            stats.update(
                episode_means(
                    "env_episodes/",
                    reduced["env_episode_return_sum"],
                    reduced["env_episode_length_sum"],
                    reduced["env_episode_count"],
                )
            )
        stats.update({k: reduced[k] for k in [*counts, *means]})

    def after_update(self) -> None:
        """Reply with the new weights to the actors whose next rollout waited for this update."""
        self._publish_weights()
        for actor in self.actors:
            if self.awaiting_reply[actor]:
                self._reply(actor, weights=True)

    def actor_states(self) -> dict[int, dict[str, Any]]:
        """Each of this learner's actors' own state (:func:`actor_state`) by actor rank, for a
        checkpoint; ``{}`` once the actors were told to stop. A rollout an actor was collecting
        is kept for the next :meth:`collect`, and the state is the actor's after it."""
        if self.stopped:
            return {}
        for actor in self.actors:  # each actor makes its state while the next one is asked
            if not self._waits_for_reply(actor):
                self._held[actor] = self._receive(actor)
            with _p2p(actor, f"learner rank {self.roles.rank}: asking actor rank {actor} for its state"):
                dist.send(
                    torch.tensor([_STATE, float(self.algo.updates)], dtype=torch.float64),
                    actor,
                    tag=_TAG_REPLY,
                )
        return {actor: self._receive_state(actor) for actor in self.actors}

    def _receive_state(self, actor: int) -> dict[str, Any]:
        rank = self.roles.rank
        size = torch.zeros(1, dtype=torch.int64)
        with _p2p(actor, f"learner rank {rank}: receiving the state of actor rank {actor}"):
            dist.recv(size, src=actor, tag=_TAG_STATE_SIZE)
            data = torch.empty(int(size.item()), dtype=torch.uint8)
            dist.recv(data, src=actor, tag=_TAG_STATE)
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True, map_location="cpu")
        if not isinstance(state, dict) or not isinstance(state.get("counters"), dict):
            raise ValueError(f"learner rank {rank}: actor rank {actor} sent a state without counters")
        return state

    def stop(self) -> None:
        """Tell every actor to stop (a rollout being collected is received and dropped)."""
        running = self.started and not self.stopped
        self.stopped = True
        if not running:
            return
        for actor in self.actors:
            if not self._waits_for_reply(actor):
                self._receive(actor)
            self._reply(actor, weights=False, stop=True)
