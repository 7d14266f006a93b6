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
- ``estimator``   ReaL-style cost model: time / memory of a PPO call under a ``CallAllocation``
                  (micro-batches, checkpointing, offload), reallocation with fan-out and
                  same-node senders, and a plan's steady-state iteration (``estimate_plan``).
- ``shapes``      named model shapes (LLaMA-2 7B..70B, Qwen2.5-Math) and HF ``config.json`` dirs.
- ``candidates``  per-call candidate allocations (ReaL's meshes x strategies x knobs).
- ``baselines``   ReaL-Heuristic, DeepSpeed-Chat-style symmetric and OpenRLHF-style disjoint plans.
- ``search``      plan search from the best fitting baseline (``search_plan``) and its CLI.

Import-light on purpose: importing the package imports no torch.distributed state, vllm or ray;
import the submodule you need.
"""
