"""Environment variables, in one place: the defaults the runtime applies, the offline/loopback
settings the tests add, and the keys every Ray worker inherits from the driver.

``setdefault`` everywhere: a user's explicit setting always wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

RUNTIME_DEFAULTS: Mapping[str, str] = {
    # In-process vLLM engine: 2 s instead of ~15 s to start on CPU, and no spawned process (no
    # sockets, no pickling of weights for load_weights).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # KV cache size in GiB on CPU; vLLM's default (4 GiB) is too much for 2-core CI machines.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # load_weights ships a Python function to the workers with collective_rpc.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}

LOOPBACK_DEFAULTS: Mapping[str, str] = {
    # vLLM's ranks and engine processes advertise this address to each other. Right where every process of
    # a run is on one node; on a multi-node cluster an engine whose ranks span two nodes could not form, so
    # there vLLM finds each node's own address (apply_loopback is called for one-node runs only).
    "VLLM_HOST_IP": "127.0.0.1",
}

TEST_DEFAULTS: Mapping[str, str] = {
    **LOOPBACK_DEFAULTS,
    # Nothing in the test suite may reach a hub or bind a public interface.
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
}

WORKER_DEFAULTS: Mapping[str, str] = {
    # Ray forwards every worker's stderr to the driver's terminal: a progress bar redrawn with "\r" there
    # (transformers' "Loading weights") interleaves with the driver's own lines. Workers report progress
    # through the driver instead.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}

# Ray workers get these from the driver, so that nothing they start talks to anything but the
# sources the driver was told to use (and they import the same code).
WORKER_KEYS: tuple[str, ...] = (
    tuple(RUNTIME_DEFAULTS)
    + tuple(TEST_DEFAULTS)
    + tuple(WORKER_DEFAULTS)
    + (
        "REALM_CACHE_DIR",
        "OMP_NUM_THREADS",
        "PYTHONPATH",
        "VLLM_LOGGING_LEVEL",
        "REALM_WORK_LOG",  # runtime.device.work_log: what each forward computed on, for bench/ppo_iteration.py
    )
)


def apply_defaults(*, tests: bool = False, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set the runtime defaults (and with ``tests`` the offline/loopback ones) where unset."""
    for table in (RUNTIME_DEFAULTS, TEST_DEFAULTS) if tests else (RUNTIME_DEFAULTS,):
        for key, value in table.items():
            environ.setdefault(key, value)


def apply_loopback(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set ``LOOPBACK_DEFAULTS`` where unset: for a run whose processes are all on this one node."""
    for key, value in LOOPBACK_DEFAULTS.items():
        environ.setdefault(key, value)


if __name__ == "__main__":  # `python -m common.env`: the test defaults as shell exports
    for table in (RUNTIME_DEFAULTS, TEST_DEFAULTS):
        for key, value in table.items():
            print(f"export {key}={value}")
