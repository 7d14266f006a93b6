"""The PPO trainer's driver: the typed config root, the loop (generate, score, advantages, train,
reallocate), rollouts, checkpoints, metrics, the SFT warm-up, plan selection, export and sweep
summaries. The top of the layer line: may import every package.
"""
