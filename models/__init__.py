"""Models: configs resolved to local HF directories (tiny builder, GGUF conversion, hub/local), the vLLM
engine (``vllm_engine.py``, the only module that imports vllm) and how FSDP2/TP are applied to a model
from outside (``parallelize.py``). May import ``reallocation``, ``mathtask`` and ``common``.
"""
