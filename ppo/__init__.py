"""The PPO math as pure tensor functions: KL-shaped GAE (``advantages``), policy and value losses,
the KL controller, minibatch and micro-batch splitting, and the optimisation configs.
May import ``common`` only; used by the driver (advantages) and the device processes (updates).
"""
