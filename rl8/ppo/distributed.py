"""Data-parallel training over torch.distributed (torchrun; ``docs/distributed.md``); outside a
process group every operation is a no-op, a failed collective raises :class:`DistributedError`."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rl8.fields import is_number, read_numbers

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV_VAR",
    "WEIGHT_SYNC_METHODS",
    "DistContext",
    "DistributedError",
    "Roles",
    "agree_on_run_seed",
    "collective_timeout_s",
    "current_roles",
    "derive_seed",
    "init_distributed",
    "local_rank",
    "rank_device",
    "shutdown_distributed",
    "to_cpu",
]

#: How learners send actors their weights: over the process group, or a file that actors read.
WEIGHT_SYNC_METHODS = ("broadcast", "checkpoint")

# Seeds of different ranks must not collide with seed + k of a neighbouring run.
_RANK_SEED_STRIDE = 1_000_003

#: Environment variable: seconds a collective waits for a peer before raising.
TIMEOUT_ENV_VAR = "RL8_DIST_TIMEOUT_S"
#: Default of :data:`TIMEOUT_ENV_VAR`: longer than a slow checkpoint or eval on rank 0.
DEFAULT_TIMEOUT_S = 120.0
_timeout_s: float | None = None  # the timeout init_distributed used
_roles: Roles | None = None  # set by init_distributed(actors=N)
_learner_group: Any = None  # the learners' process group (actors/learners mode)


class DistributedError(RuntimeError):
    """A collective failed: another rank died, raised, or stalled past the timeout."""


@dataclasses.dataclass(frozen=True)
class Roles:
    """Who does what in a job of actors and learners (``rl8 train --actors N``): ranks
    ``0 .. learners - 1`` learn, the others act (docs/distributed.md).

    Attributes:
        rank: This process's rank in the job.
        world_size: Processes in the job.
        actors: Actor processes (>= 1).
    """

    rank: int
    world_size: int
    actors: int

    def __post_init__(self) -> None:
        if (
            isinstance(self.actors, bool)
            or not isinstance(self.actors, int)
            or not 1 <= self.actors < self.world_size
        ):
            raise ValueError(
                f"actors: expected an int from 1 to {self.world_size - 1} (the job has {self.world_size} "
                f"processes and needs at least one learner), got {self.actors!r}"
            )
        if self.actors % self.learners:
            raise ValueError(
                f"actors: expected a multiple of the number of learners ({self.learners} = {self.world_size} "
                f"processes - {self.actors} actors), so that every learner gets as many actors, got {self.actors}"
            )

    @property
    def learners(self) -> int:
        """Learner processes."""
        return self.world_size - self.actors

    @property
    def actors_per_learner(self) -> int:
        """Actors whose rollouts make one learner's update batch."""
        return self.actors // self.learners

    @property
    def is_actor(self) -> bool:
        """Whether this rank is an actor (collects only)."""
        return self.rank >= self.learners

    def learner_of(self, actor: int) -> int:
        """The rank of the learner that actor rank ``actor`` sends its rollouts to."""
        return (actor - self.learners) % self.learners

    def actors_of(self, learner: int) -> list[int]:
        """The actor ranks of learner rank ``learner``, by slot."""
        return [a for a in range(self.learners, self.world_size) if self.learner_of(a) == learner]


def collective_timeout_s() -> float:
    """Seconds a collective or transfer waits for a peer before raising."""
    return _timeout_s if _timeout_s is not None else DEFAULT_TIMEOUT_S


def current_roles() -> Roles | None:
    """The roles :func:`init_distributed` set up (``None``: data-parallel or one process)."""
    return _roles


def derive_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank`` in a run seeded with ``seed`` (rank 0 keeps ``seed``)."""
    return (seed + rank * _RANK_SEED_STRIDE) % (2**31)


def local_rank() -> int:
    """This process's rank on its machine (``LOCAL_RANK``, set by torchrun; 0 otherwise)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(device: str | torch.device) -> str | torch.device:
    """The device a rank trains on: under torchrun with CUDA, ``"auto"`` and ``"cuda[:N]"``
    become ``"cuda:LOCAL_RANK"``; anything else is returned unchanged."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.cuda.is_available():
        return device
    if str(device) == "auto" or str(device).startswith("cuda"):
        return f"cuda:{local_rank()}"
    return device


def _timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_ENV_VAR, "")
    if not text.strip():
        return DEFAULT_TIMEOUT_S
    value = read_numbers(text)
    if not (is_number(value) and value > 0):
        raise ValueError(f"{TIMEOUT_ENV_VAR}: expected a number of seconds > 0, got {text!r}")
    return float(value)


def init_distributed(
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
    actors: int | None = None,
) -> bool:
    """Join the process group that torchrun describes in the environment, if any (destroyed
    at exit); returns whether one is active.

    Args:
        backend: A torch.distributed backend; ``None``: ``"cpu:gloo,cuda:nccl"`` with CUDA,
            else ``"gloo"``.
        timeout_s: Seconds a collective may wait for a peer before raising; ``None``: the
            ``RL8_DIST_TIMEOUT_S`` environment variable, else :data:`DEFAULT_TIMEOUT_S`.
        actors: Make this many ranks actors, which only collect (:class:`Roles`); ``None``:
            data-parallel training. A ``ValueError`` outside torchrun or for an invalid count.
    """
    global _timeout_s, _roles, _learner_group
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if actors is not None:
        if world_size <= 1:
            raise ValueError(
                f"actors={actors}: actors and learners need a torchrun job of several processes "
                f"(WORLD_SIZE={world_size}); launch with torchrun --nproc_per_node=N"
            )
        Roles(int(os.environ.get("RANK", "0")), world_size, actors)  # its checks, before joining
    if not (dist.is_available() and dist.is_initialized()):
        if world_size <= 1:
            return False
        if not dist.is_available():  # pragma: no cover - torch built without distributed
            raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
        if timeout_s is None:
            timeout_s = _timeout_from_env()
        if backend is None:
            backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if "nccl" in backend:
            torch.cuda.set_device(local_rank())
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        _timeout_s = float(timeout_s)
        atexit.register(shutdown_distributed)
    if actors is not None and _roles is None:  # the learners' group: every rank takes part in making it
        roles = Roles(dist.get_rank(), dist.get_world_size(), actors)
        _learner_group = dist.new_group(list(range(roles.learners)))
        _roles = roles
    return True


def shutdown_distributed() -> None:
    """Destroy the process group, if any (idempotent; errors of a broken group are ignored).
    No collective: a rank that exits on an error must not wait for the others."""
    global _roles, _learner_group
    _roles = _learner_group = None
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):  # a peer may be gone already
            time.sleep(0.05)  # else gloo's threads may abort the process while Python finalises
            dist.destroy_process_group()


def agree_on_run_seed(seed: int) -> int:
    """The largest ``seed`` over every rank of the job: one random run seed for all."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return int(seed)
    t = torch.tensor([seed], dtype=torch.int64, device=DistContext().device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class DistContext:
    """The process group PPO trains in: every rank, or with actors the learners' group (on an
    actor a context of one process); a no-op outside torch.distributed.

    Attributes:
        enabled: Whether a group with more than one rank is active.
        rank: This process's rank in that group (0 when not distributed).
        world_size: Number of ranks in that group (1 when not distributed).
        global_rank: This process's rank in the whole job (0 when not distributed).
        group: The torch.distributed group of the collectives (``None``: every rank).
    """

    def __init__(self) -> None:
        active = dist.is_available() and dist.is_initialized()
        self.global_rank = dist.get_rank() if active else 0
        self.group = _learner_group
        alone = _roles is not None and _roles.is_actor
        self.enabled = active and not alone and dist.get_world_size(self.group) > 1
        self.rank = dist.get_rank(self.group) if self.enabled else 0
        self.world_size = dist.get_world_size(self.group) if self.enabled else 1
        # where small control tensors live: CPU unless the group can only move CUDA tensors
        backend = str(dist.get_backend()) if self.enabled else "gloo"
        cuda_only = "nccl" in backend and "gloo" not in backend
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if cuda_only else torch.device("cpu")
        )

    @contextlib.contextmanager
    def _collective(self, what: str):
        """Turn the backend's error into one that says what probably happened."""
        try:
            yield
        except DistributedError:
            raise
        except RuntimeError as exc:  # torch.distributed.DistError and friends
            waited = f"{_timeout_s:g} s" if _timeout_s is not None else "the group's timeout"
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DistributedError(
                f"rank {self.rank} of {self.world_size}: {what} failed: another rank died, "
                f"raised an error, or did not join it within {waited} ({TIMEOUT_ENV_VAR}); "
                f"see the other ranks' output for the cause. Backend error: {cause}"
            ) from exc

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 of the job (which tracks and checkpoints)."""
        return self.global_rank == 0

    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce ``tensor`` in place with ``op`` in ``{"sum", "min", "max"}``."""
        if self.enabled:
            ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
            with self._collective("an all-reduce of statistics"):
                dist.all_reduce(tensor, op=ops[op], group=self.group)
        return tensor

    def average_gradients(self, params: list[nn.Parameter]) -> None:
        """Average the gradients of ``params`` across ranks with ONE all-reduce."""
        if not self.enabled:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        with self._collective("the all-reduce of gradients"):
            dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        for p, averaged in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(averaged.view_as(p))

    def broadcast_module(self, module: nn.Module, src: int = 0) -> None:
        """Make every rank's parameters and buffers equal to rank ``src``'s."""
        if not self.enabled:
            return
        with self._collective("the broadcast of the initial model"), torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src, group=self.group)

    def max(self, values: list[float]) -> list[float]:
        """The element-wise maximum of ``values`` (the same length on every rank) over ranks."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        with self._collective("the step-boundary agreement (stop, signals)"):
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def check_same(self, what: str, values: dict[str, Any]) -> None:
        """Raise :class:`DistributedError` on every rank unless every rank's ``values`` equal
        rank 0's, naming the first rank and key that differ (``what``: what they are)."""
        if not self.enabled:
            return
        ranks: list[Any] = [None] * self.world_size
        with self._collective(f"the check that every rank has the same {what}"):
            dist.all_gather_object(ranks, values, group=self.group)
        for rank, other in enumerate(ranks[1:], 1):
            key = next(
                (k for k in [*ranks[0], *other] if ranks[0].get(k, "<none>") != other.get(k, "<none>")),
                None,
            )
            if key is not None:
                raise DistributedError(
                    f"the ranks' {what} differ: {key} is {ranks[0].get(key, '<none>')!r} on rank 0 but "
                    f"{other.get(key, '<none>')!r} on rank {rank}; every rank must train with the same {what}"
                )

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (picklable), on every rank."""
        if not self.enabled:
            return obj
        box = [obj if self.rank == src else None]
        with self._collective("a broadcast from rank 0"):
            dist.broadcast_object_list(
                box,
                src=src,
                group=self.group,
                device=self.device if self.device.type == "cuda" else None,
            )
        return box[0]

    def on_main(self, call: Callable[[], Any], *, scatter: bool = False) -> Any:
        """Run ``call()`` on rank 0 only and return its result, or raise its exception, on
        every rank (so that no rank waits for a rank 0 that failed).

        Args:
            call: What rank 0 does; what it returns must be picklable.
            scatter: ``call()`` returns one item per rank, and rank ``r`` gets item ``r``.
        """
        if not self.enabled:
            result = call()
            return result[0] if scatter else result
        outcome: Any = None
        if self.is_main:
            try:
                outcome = call()
            except BaseException as exc:  # noqa: BLE001 - every rank raises it
                outcome = [_picklable(exc)] * self.world_size if scatter else _picklable(exc)
        received = self.scatter_from_main(outcome) if scatter else self.broadcast_object(outcome)
        if isinstance(received, BaseException):
            raise received
        return received

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` (picklable, tensors on the CPU) in a list on rank 0, else None."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size if self.is_main else None
        with self._collective("gathering every rank's state on rank 0"):
            dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def scatter_from_main(self, objs: list[Any] | None) -> Any:
        """Rank 0's ``objs[r]`` on rank ``r`` (``objs`` is only read on rank 0)."""
        if not self.enabled:
            return objs[0]
        box: list[Any] = [None]
        with self._collective("sending every rank its state from rank 0"):
            dist.scatter_object_list(box, objs if self.is_main else None, src=0, group=self.group)
        return box[0]


def _picklable(exc: BaseException) -> BaseException:
    """``exc``, or a RuntimeError with its message when it cannot be sent to another rank."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"on rank 0: {type(exc).__name__}: {exc}")


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in its nested dicts, lists and tuples moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((k, to_cpu(v)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
