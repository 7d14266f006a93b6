"""Shared fixtures: an isolated model cache, the tiny model, offline/loopback environment."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from common.env import apply_defaults  # noqa: E402

apply_defaults(tests=True)  # offline, loopback only (common/env.py)


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """Models built by tests go to one cache shared by the session (or $REALM_CACHE_DIR if set)."""
    if "REALM_CACHE_DIR" not in os.environ:
        os.environ["REALM_CACHE_DIR"] = str(tmp_path_factory.mktemp("realm-cache"))
    yield


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The `tiny` model config's HF directory (2-layer Qwen2, head_dim 64, local tokenizer)."""
    from models.config import ModelConfig
    from models.registry import resolve_model_dir

    return resolve_model_dir(ModelConfig())


@pytest.fixture(scope="session")
def tiny_kv2_model_dir():
    """The tiny model with 2 kv heads (training TP=2 shards by kv head; the default tiny has one)."""
    from models.config import ModelConfig, TinyArchConfig
    from models.registry import resolve_model_dir

    return resolve_model_dir(ModelConfig(tiny=TinyArchConfig(num_kv_heads=2)))


@pytest.fixture(autouse=True)
def _equivalence_marker(request):
    """A test that compares through tests/tolerance.py must be marked ``equivalence``, so that the CI's
    second kernel-set pass runs it (docs/development.md, "Tolerances")."""
    tolerance = sys.modules.get("tests.tolerance")
    if tolerance is not None:
        tolerance.num_comparisons = 0
    yield
    tolerance = sys.modules.get("tests.tolerance")
    if tolerance is not None and tolerance.num_comparisons and not request.node.get_closest_marker("equivalence"):
        pytest.fail(f"{request.node.nodeid} compares with tests/tolerance.py: mark it @pytest.mark.equivalence")


def pytest_collection_finish(session):
    """The built-in reward models the selected tests use (``builtin_reward_models`` marks) are trained
    side by side before the first test, each in a process of its own on one thread, instead of one after
    the other when a test first asks (on 2 cores the ORM's 10 minutes then hide the PRM's 5). Only into
    an explicit $REALM_CACHE_DIR (scripts/run_tests.sh sets one); what is cached already is not trained."""
    cache = os.environ.get("REALM_CACHE_DIR")
    kinds = sorted({k for item in session.items for m in item.iter_markers("builtin_reward_models") for k in m.args})
    if not cache or not kinds:
        return
    import subprocess
    import time
    from pathlib import Path

    from common.files import is_complete
    from rewards.rm_config import builtin_config, default_output_dir

    todo = [f"builtin:synthetic-{k}" for k in kinds]
    todo = [path for path in todo if not is_complete(default_output_dir(builtin_config(path)))]
    if not todo:
        return
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    logs = {path: Path(cache) / f"train-{path.split(':')[1]}.log" for path in todo}
    report.write_line(
        f"[tests] training {', '.join(todo)} side by side first: logs {', '.join(map(str, logs.values()))}"
    )
    root, started = Path(__file__).resolve().parents[1], time.time()
    code = "import sys; from rewards.train_rm import ensure_builtin; ensure_builtin(sys.argv[1])"
    procs = {}
    for path, log in logs.items():
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            procs[path] = subprocess.Popen(
                [sys.executable, "-c", code, path], cwd=root, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(root)},
            )  # fmt: skip
    try:
        failed = [path for path, proc in procs.items() if proc.wait() != 0]
    finally:  # an interrupted session leaves no training behind
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    if failed:  # the tests that use them train them again, and fail there with the whole traceback
        report.write_line(f"[tests] training {', '.join(failed)} failed: see {', '.join(str(logs[p]) for p in failed)}")
    report.write_line(f"[tests] built-in reward models trained in {time.time() - started:.0f} s")


def leave_process_group() -> None:
    """End a spawned rank: a barrier, then destroy the group. A rank that tears down gloo while a peer is
    still finishing its last collective can abort that peer ('terminate called without an active
    exception', seen once under load in tests/runtime/test_shards.py); after the barrier no rank is
    still talking."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def isolated_config_store():
    """For tests that run a CLI module with runpy, as `python -m` would: re-executing the module
    registers *its new copy* of the schema class in Hydra's process-wide ConfigStore, and later tests
    in this process would then compose to that class and fail the schema check. Restore the store."""
    import copy

    from hydra.core.config_store import ConfigStore

    saved = copy.deepcopy(ConfigStore.instance().repo)
    yield
    ConfigStore.instance().repo = saved
