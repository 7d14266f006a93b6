"""Models: configs resolved to local HF directories (tiny builder, GGUF conversion, hub/local), the vLLM
engine (``vllm_engine.py``, the only module that imports vllm) and how FSDP2/TP are applied to a model
from outside (``parallelize.py``), and each rank converting only the weights it keeps from the dtype a
checkpoint stores (``stored_weights.py``). May import ``reallocation``, ``mathtask`` and ``common``.
"""
