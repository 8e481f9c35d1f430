"""TorchRL's side of the peers benchmark: its collector, ``GAE`` and ``ClipPPOLoss`` on CartPole.

Runs in TorchRL's virtualenv. The env is gymnasium's ``SyncVectorEnv`` of ``num_envs`` envs
(with ``SAME_STEP`` autoreset, as the CleanRL-style loop's) wrapped by TorchRL's ``GymWrapper``; the
policy a ``ProbabilisticActor`` (one-hot categorical) over a 64x64 tanh MLP, the critic a
``ValueOperator`` over another; a ``Collector`` (in this process) gathers ``num_envs * horizon``
frames per batch; ``GAE`` once per batch, then ``epochs`` passes of ``minibatches``
minibatches drawn without replacement from a replay buffer, each a ``ClipPPOLoss`` step (no
entropy bonus, L2 critic loss weighted by the value coefficient, advantages normalised per
minibatch) with Adam (eps 1e-5) and gradient-norm clipping.

    python benchmarks/peers/side_torchrl.py CartPole-v1 --threads 2
"""

from __future__ import annotations

import importlib.metadata
import time

from workloads import WORKLOADS, batch_size, emit, iterations, minibatch_size, parse_side_args


def main() -> None:
    """Time collect + update on one gym workload and print the JSON line of ``emit``."""
    args = parse_side_args()
    import gymnasium
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
    from torchrl.envs import GymWrapper
    from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    w = WORKLOADS[args.workload]
    if w["env"] != "CartPole-v1":
        raise SystemExit("the TorchRL side measures CartPole-v1 only")
    torch.manual_seed(0)
    vector_env = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make(w["env"]) for _ in range(w["num_envs"])],
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,  # TorchRL refuses NEXT_STEP
    )
    env = GymWrapper(vector_env, device="cpu")
    env.set_seed(0)
    obs_dim = env.observation_spec["observation"].shape[-1]
    n_actions = env.action_spec.shape[-1]
    act = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}[w["activation"]]
    actor_net = MLP(
        in_features=obs_dim, out_features=n_actions, num_cells=list(w["hiddens"]), activation_class=act
    )
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
        return_log_prob=True,
    )
    critic = ValueOperator(
        MLP(in_features=obs_dim, out_features=1, num_cells=list(w["hiddens"]), activation_class=act),
        in_keys=["observation"],
    )
    advantage = GAE(gamma=w["gamma"], lmbda=w["gae_lambda"], value_network=critic, average_gae=False)
    loss_fn = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=w["clip"],
        entropy_bonus=False,
        critic_coeff=w["vf_coeff"],
        loss_critic_type="l2",
        normalize_advantage=True,
    )
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=w["lr"], eps=1e-5)
    frames = batch_size(w)
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=-1, device="cpu")
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(frames),
        sampler=SamplerWithoutReplacement(),
        batch_size=minibatch_size(w),
    )
    warmup, iters = iterations(w, args.quick)
    start = None
    for i, data in enumerate(collector):
        with torch.no_grad():
            advantage(data)
        buffer.extend(data.reshape(-1))
        for _ in range(w["epochs"]):
            for _ in range(w["minibatches"]):
                losses = loss_fn(buffer.sample())
                loss = losses["loss_objective"] + losses["loss_critic"]
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_fn.parameters(), w["max_grad_norm"])
                optimizer.step()
        collector.update_policy_weights_()
        if i + 1 == warmup:
            start = time.perf_counter()  # the collector's next batch starts now
        if i + 1 == warmup + iters:
            break
    seconds = time.perf_counter() - start
    collector.shutdown()
    emit(
        iters * frames,
        seconds,
        torchrl=importlib.metadata.version("torchrl"),
        gymnasium=importlib.metadata.version("gymnasium"),
    )


if __name__ == "__main__":
    main()
