"""The PPO layer: the algorithm (:mod:`~rl8.ppo.algorithm`), its hyper-parameters, the rollout
buffer and GAE, the rollout loops, the loss, stats, the overlapped collection mode, the
``torch.distributed`` helpers, and the resolver of the names you give (:mod:`~rl8.ppo.resolve`).
It knows the policy and env layers, nothing of training, tracking or the command line."""
