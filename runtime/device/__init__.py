"""The device process (one per plan device) and what it hosts: policy, critic and reference shards
(``shards``), the reward shard (``reward``), pipeline stages (``pipeline``) and its ranks."""
