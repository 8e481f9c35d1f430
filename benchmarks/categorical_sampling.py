"""Choice-major categorical sampling against the plain row-major path, on realistic workloads.

A speed trick stays in rl8 only if a benchmark on a realistic workload shows it >= 10 % faster
in one run. The trick measured here: for short rows (2 to 15 choices) of big batches (>= 256
rows), compute ``log_softmax`` and the inverse-CDF draw over dim 0 of a transposed contiguous
``[n, B]`` copy (torch's CPU kernels vectorise along the last dim, so rows of 2 or 3 choices
leave vector lanes idle). The plain path is ``log_softmax`` over the last dim, one uniform per
row, ``searchsorted`` in the cumulative probabilities and a ``gather`` of the log-prob: the
same draws from the same generator (``tests/test_distributions.py`` checks rl8's sampler).
``torch.multinomial`` and the Gumbel-max draw are timed too, for reference (other draws).

Both sides are defined here (:func:`choice_major`, :func:`row_major`), so this file measures the
trick whether rl8 has it or not. Workloads, one torch thread, CPU, float32, the sides taking
turns in one run (call by call for steps and sampling, block by block for collects, the side
that starts alternating):

* ``step``: one rollout step of a policy: actor and critic heads, then the action and its
  log-prob written into the rows of a rollout buffer (as ``rl8.ppo.rollout`` does).
  CartPole-like: 4 observations, 64x64 tanh MLPs, 2 actions. Atari-like: the 512 features of
  a Nature CNN (the CNN itself left out: it would only shrink the share of sampling), linear
  heads, 18 actions (the trick never applies to 18 choices: it is there to show the plain
  path's cost where the trick cannot help). 64, 256, 1024 and 4096 envs.
* ``collect``: ``PPO.collect()`` of ``benchmarks/test_throughput.py``'s ``small`` (512 envs,
  64x64 MLPs) and ``large`` (8192 envs, 256x256 MLPs) workloads (DiscreteDummyEnv, 3 actions,
  horizon 32), the policy's ``distribution_cls`` set to a :class:`Categorical` that samples
  with one side or the other.

Run: ``PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/categorical_sampling.py``
(``--quick`` for a short check). Prints, per workload, the median time of each side,
``row/choice`` (row-major / choice-major, > 1: the trick is faster) and ``saved sampling``: the
sampling time the trick saves (timed alone, on the same batch) over the step's or collect's time,
the most it can gain there, far steadier than the whole timings on a shared machine.

Result, one run (2-core development machine shared with other jobs, load ~5, 1 torch thread,
rl8 a1d9c12): the trick sped up the sampling alone 1.1x / 1.5x / 2.0x at 256 / 1024 /
4096 rows of 2 choices, but that is +0.9 % / +1.7 % / +0.8 % of a CartPole-like rollout step
(the MLPs dominate) and nothing at 64 rows or with 18 choices. Whole collects of
``test_throughput.py`` (3 choices): ``small`` 29.5 ms plain vs 28.9 ms trick (1.020; the
sampling it saves is 2.1 % of the collect), ``large`` 3915 ms vs 3968 ms (0.987; 0.3 %). The
timed steps and collects move by up to +-10 % from run to run on this machine (the
CartPole-like step at 4096 envs read 1.100 in this run, where the sampling saved is 0.8 % of
it). Below the 10 % bar on every realistic
whole workload: rl8 samples row-major (the trick was removed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from rl8.policies.distributions import Categorical

Sampler = Callable[[torch.Tensor, torch.Generator, tuple[torch.Tensor, torch.Tensor]], None]


def row_major(
    logits: torch.Tensor, generator: torch.Generator, out: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """The plain path: actions ``[B]`` and their log-probs written into ``out``."""
    log_probs = torch.log_softmax(logits, -1)
    cdf = log_probs.exp().cumsum(-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator)
    index = torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1)
    out[0].copy_(index.squeeze(-1))
    out[1].copy_(log_probs.gather(-1, index).squeeze(-1))


def choice_major(
    logits: torch.Tensor, generator: torch.Generator, out: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """The trick (rl8's code before it was removed, unmasked ``Discrete`` case): the same draws
    as :func:`row_major`, computed over dim 0 of ``[n, B]`` for ``1 < n <= 15`` and ``B >= 256``."""
    n = logits.shape[-1]
    if not (1 < n <= 15 and logits.shape[0] >= 256):
        row_major(logits, generator, out)
        return
    by_choice = torch.log_softmax(logits.T, 0)
    cdf = by_choice.exp().cumsum(0)
    u = torch.rand(cdf.shape[1:], generator=generator)
    torch.sum(cdf[:-1] < u, 0, out=out[0])
    torch.gather(by_choice, 0, out[0].unsqueeze(0), out=out[1].unsqueeze(0))


def multinomial(
    logits: torch.Tensor, generator: torch.Generator, out: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """``torch.distributions.Categorical``'s draw: ``torch.multinomial`` of the probabilities."""
    log_probs = torch.log_softmax(logits, -1)
    index = torch.multinomial(log_probs.exp(), 1, generator=generator)
    out[0].copy_(index.squeeze(-1))
    out[1].copy_(log_probs.gather(-1, index).squeeze(-1))


def gumbel_max(
    logits: torch.Tensor, generator: torch.Generator, out: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """The Gumbel-max draw: ``argmax(logits - log(-log(u)))``."""
    log_probs = torch.log_softmax(logits, -1)
    u = torch.rand(logits.shape, generator=generator).clamp_(min=1e-20)
    index = (logits - u.log_().neg_().log_()).argmax(-1, keepdim=True)
    out[0].copy_(index.squeeze(-1))
    out[1].copy_(log_probs.gather(-1, index).squeeze(-1))


SIDES: dict[str, Sampler] = {"row-major": row_major, "choice-major": choice_major}
REFERENCES: dict[str, Sampler] = {"multinomial": multinomial, "gumbel-max": gumbel_max}


def timed_in_turns(
    runs: dict[str, Callable[[], object]], blocks: int, per_block: int
) -> dict[str, float]:
    """Median seconds of one call of each of ``runs``, timed in blocks of ``per_block`` calls,
    the runs taking turns block by block (the order reversed every other block)."""
    for run in runs.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for b in range(blocks):
        for name in order if b % 2 == 0 else order[::-1]:
            run = runs[name]
            for _ in range(per_block):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


class StepPolicy:
    """Actor and critic of one policy step, and the buffer rows the step writes into."""

    def __init__(self, num_envs: int, obs_size: int, hidden: tuple[int, ...], num_actions: int) -> None:
        def mlp(out_size: int) -> nn.Sequential:
            sizes, layers = (obs_size, *hidden), []
            for a, b in zip(sizes[:-1], sizes[1:]):
                layers += [nn.Linear(a, b), nn.Tanh()]
            return nn.Sequential(*layers, nn.Linear(sizes[-1], out_size))

        torch.manual_seed(0)
        self.actor, self.critic = mlp(num_actions), mlp(1)
        self.obs = torch.randn(num_envs, obs_size)
        self.generator = torch.Generator().manual_seed(0)
        self.rows = (torch.zeros(num_envs, dtype=torch.int64), torch.zeros(num_envs))

    @torch.no_grad()
    def step(self, sampler: Sampler) -> None:
        """One rollout step: both heads, then the sampler writes the action and its log-prob."""
        logits = self.actor(self.obs)
        self.critic(self.obs)
        sampler(logits, self.generator, self.rows)


STEP_WORKLOADS = {"CartPole-like": (4, (64, 64), 2), "Atari-like": (512, (), 18)}


def bench_steps(env_counts: list[int], blocks: int) -> None:
    for name, (obs_size, hidden, num_actions) in STEP_WORKLOADS.items():
        for num_envs in env_counts:
            policy = StepPolicy(num_envs, obs_size, hidden, num_actions)
            logits = policy.actor(policy.obs).detach()
            turns = max(
                blocks, blocks * 256 // num_envs
            )  # one call per turn: the sides alternate call by call

            def sampling(f: Sampler) -> Callable[[], None]:
                return lambda: f(logits, policy.generator, policy.rows)

            sample = timed_in_turns({side: sampling(f) for side, f in SIDES.items()}, 4 * turns, 1)
            sample |= timed_in_turns({side: sampling(f) for side, f in REFERENCES.items()}, 4 * turns, 1)
            step = timed_in_turns(
                {side: (lambda f=f: policy.step(f)) for side, f in SIDES.items()}, turns, 1
            )
            # what the trick can save at most in a step: the sampling time it saves, over the step's time
            bound = (sample["row-major"] - sample["choice-major"]) / step["row-major"]
            print(
                f"{name:>13} {num_envs:5d} envs | sampling (us): "
                + " ".join(f"{s} {1e6 * t:7.1f}" for s, t in sample.items())
                + f" | row/choice {sample['row-major'] / sample['choice-major']:.3f}"
                + f" || step (us): row {1e6 * step['row-major']:7.1f} choice {1e6 * step['choice-major']:7.1f}"
                + f" row/choice {step['row-major'] / step['choice-major']:.3f}"
                + f" | saved sampling / step {100 * bound:+.1f} %",
                flush=True,
            )


def categorical_sampling_with(sampler: Sampler) -> type[Categorical]:
    """A :class:`Categorical` whose ``sample_with_log_prob`` (what the rollout calls) is ``sampler``."""

    class SampledWith(Categorical):
        def sample_with_log_prob(self, generator=None, *, deterministic=False, out=None):
            assert not deterministic and generator is not None
            rows = (
                out
                if out is not None
                else (
                    torch.empty(self.logits.shape[0], dtype=torch.int64),
                    torch.empty(self.logits.shape[0]),
                )
            )
            sampler(self.logits, generator, rows)
            return rows

    SampledWith.__name__ = f"Categorical_{sampler.__name__}"
    return SampledWith


def bench_collects(names: dict[str, int]) -> None:
    """``names``: the workloads of ``test_throughput.py`` and the blocks of collects to time each."""
    from test_throughput import WORKLOADS, make_algo

    for name, blocks in names.items():
        w = WORKLOADS[name]
        algos = {}
        for side, sampler in SIDES.items():
            algo = make_algo(w)
            algo.policy.distribution_cls = categorical_sampling_with(sampler)
            algos[side] = algo
        seconds = timed_in_turns(
            {side: algo.collect for side, algo in algos.items()}, blocks, w["block"]
        )
        # the bound: the sampling time the trick saves on this batch, times the horizon, over a collect
        logits = torch.randn(w["num_envs"], 3)
        rows = (torch.zeros(w["num_envs"], dtype=torch.int64), torch.zeros(w["num_envs"]))
        generator = torch.Generator().manual_seed(0)
        sample = timed_in_turns(
            {side: (lambda f=f: f(logits, generator, rows)) for side, f in SIDES.items()},
            max(200, 200_000 // w["num_envs"]),
            1,
        )
        bound = w["horizon"] * (sample["row-major"] - sample["choice-major"]) / seconds["row-major"]
        print(
            f"collect {name:>6} ({w['num_envs']} envs x {w['horizon']}, {w['hidden']}x{w['hidden']}) | "
            f"ms: row {1e3 * seconds['row-major']:8.1f} choice {1e3 * seconds['choice-major']:8.1f} | "
            f"row/choice {seconds['row-major'] / seconds['choice-major']:.3f} | sampling (us): "
            f"row {1e6 * sample['row-major']:.1f} choice {1e6 * sample['choice-major']:.1f} | "
            f"saved sampling / collect {100 * bound:+.1f} %",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks, small collect only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench_steps([64, 256, 1024, 4096], blocks=20 if args.quick else 200)
    bench_collects({"small": 2} if args.quick else {"small": 30, "large": 8})


if __name__ == "__main__":
    main()
