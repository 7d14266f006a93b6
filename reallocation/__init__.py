"""Moving a model's weights between layouts (the ReaL idea), each destination receiving only what it lacks.

``layout`` (layouts as data), ``plan`` (pure transfer planning), ``reshard`` (plan execution over
torch.distributed), ``names`` (HF <-> vLLM parameter names) and ``sync`` (the entry the runtime calls).
May import ``common`` only; nothing here imports vllm, ray or a model.
"""
