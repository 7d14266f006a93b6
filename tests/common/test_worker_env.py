"""What a Ray worker's environment is made of (common/env.py, runtime/placement.py)."""

from __future__ import annotations

from runtime.placement import _actor_env


def test_workers_draw_no_progress_bars_and_inherit_the_driver_keys(monkeypatch):
    monkeypatch.setenv("REALM_CACHE_DIR", "/shared/cache")
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    env = _actor_env("10.0.0.1")
    # A bar redrawn with "\r" in a worker would interleave with the driver's lines in its terminal.
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert env["REALM_CACHE_DIR"] == "/shared/cache" and env["MASTER_ADDR"] == "10.0.0.1"


def test_a_users_explicit_setting_wins(monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert _actor_env("127.0.0.1")["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_device_threads_share_the_cores_out_over_the_plans_devices():
    from runtime.placement import threads_per_device

    # 2 cores: two devices get a thread each (both busy at once), a lone device gets both.
    assert threads_per_device(2, 2) == 1 and threads_per_device(2, 1) == 2
    assert threads_per_device(2, 4) == 1 and threads_per_device(8, 3) == 2  # never 0; whole threads only


def test_vllm_advertises_loopback_on_one_node_only():
    """An engine whose ranks span two nodes cannot form on 127.0.0.1: the runtime defaults leave vLLM's
    address to vLLM, and a cluster of one node (a local Ray, or a joined Ray with one live node) sets it,
    forwarded to every actor; a user's own setting stays."""
    from common.env import RUNTIME_DEFAULTS, WORKER_KEYS, apply_defaults
    from runtime.placement import loopback_if_one_node

    environ: dict[str, str] = {}
    apply_defaults(environ=environ)
    assert "VLLM_HOST_IP" not in environ and "VLLM_HOST_IP" not in RUNTIME_DEFAULTS
    loopback_if_one_node(2, environ)
    assert "VLLM_HOST_IP" not in environ
    loopback_if_one_node(1, environ)
    assert environ["VLLM_HOST_IP"] == "127.0.0.1" and "VLLM_HOST_IP" in WORKER_KEYS
    mine = {"VLLM_HOST_IP": "10.0.0.7"}
    loopback_if_one_node(1, mine)
    assert mine == {"VLLM_HOST_IP": "10.0.0.7"}
