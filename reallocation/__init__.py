"""Parameter reallocation core (the ReaL idea): move a model between layouts moving only what
each destination rank lacks.

- ``layout``      layouts as data: ranks x (pp, dp, fsdp, tp) and a partition spec per parameter.
- ``plan``        pure transfer planning (no torch.distributed) and round scheduling.
- ``reshard``     plan execution over torch.distributed (gloo / NCCL), plus the baseline.
- ``names``       HF <-> vLLM parameter names and fused shapes (qkv_proj, gate_up_proj, vocab padding).
- ``parallelize`` FSDP2 / DTensor TP for HF Llama/Qwen2 models (``apply_fsdp``, ``apply_tp``).
- ``sync``        the trainer's entry for pushing training weights into a generation engine.
- ``execution_plan`` the plan format: a ``CallAllocation`` (GPUs, pp/dp/tp, micro-batches,
                  checkpointing, offload) per PPO call, YAML round trip, validation.
- ``estimator``   ReaL-style cost model: time / memory of a model function call under an
                  allocation, and reallocation time from the plan's lower bound.
- ``search``      PPO dataflow graph, candidate allocations, list-scheduling simulator, MCMC
                  search over execution plans.

Import-light on purpose: importing the package imports no torch.distributed state, vllm or ray;
import the submodule you need.
"""
