"""The PPO layer: the algorithm, its hyper-parameters, buffer, rollout loops, loss, stats and
collection modes. It knows the policy and env layers, nothing of training, tracking or the CLI."""
