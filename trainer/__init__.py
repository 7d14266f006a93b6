"""PPO for math reasoning: typed config, batch types, advantages, losses, update and the loop."""
