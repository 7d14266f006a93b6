"""Starting Ray for a cluster config: a one-node cluster (``local_cpu``, ``gpu_1x8``) starts a Ray of its own,
a multi-node one (``gpu_2x8``) joins the Ray that ``ray start`` started (``runtime/placement.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from runtime.placement import LOOPBACK, PlacementError, RayCluster, check_visible_gpus, ray_init_arguments
from trainer.compose import to_train_config
from trainer.config import register_configs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
register_configs()


def _cluster(name: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=[f"cluster={name}"])).cluster


def test_one_node_clusters_start_their_own_ray_and_two_nodes_join_one():
    """What ``trainer/loop.py`` asks of Ray for each shipped cluster: the devices of a one-node GPU cluster
    become the local Ray's GPUs (no ``ray start``), a CPU cluster's become the custom device resource, and
    a two-node cluster joins the Ray started on its nodes, whose resources the nodes declared."""
    one_gpu_node, cpu, two_nodes = _cluster("gpu_1x8"), _cluster("local_cpu"), _cluster("gpu_2x8")
    assert one_gpu_node.address == "" and cpu.address == "" and two_nodes.address == "auto"
    gpu = ray_init_arguments(one_gpu_node.address, one_gpu_node.num_cpus, one_gpu_node.devices_per_node, 0)
    assert (gpu["address"], gpu["num_gpus"], gpu["resources"], gpu["_node_ip_address"]) == ("local", 8, None, LOOPBACK)
    local = ray_init_arguments(cpu.address, cpu.num_cpus, 0, cpu.num_devices)
    assert (local["address"], local["num_gpus"], local["resources"]) == ("local", 0, {"realm_device": 2})
    assert ray_init_arguments(two_nodes.address, two_nodes.num_cpus, 0, 0) == {"address": "auto"}


def test_a_local_ray_refuses_more_gpus_than_the_node_shows(monkeypatch):
    check_visible_gpus(8, 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(PlacementError, match=r"^cluster.devices_per_node=8: this node shows 4 GPUs \(CUDA_VISIB"):
        check_visible_gpus(8, 4)
    monkeypatch.setattr("runtime.placement._visible_gpus", lambda: 0)  # this machine: no CUDA
    with pytest.raises(PlacementError, match="this node shows 0 GPUs"):
        RayCluster.start("", num_cpus=1, num_gpus=1)  # before Ray starts


def test_a_local_ray_offers_the_gpus_of_a_one_node_gpu_cluster(monkeypatch):
    """The plan's devices are Ray's GPUs on a local Ray started for ``gpu_1x8`` (8 declared here, where
    ``torch.cuda`` is told it sees 8: the stand-in for the node's GPUs)."""
    import ray

    monkeypatch.setattr("runtime.placement._visible_gpus", lambda: 8)
    cluster = RayCluster.start("", num_cpus=1, num_gpus=8)
    try:
        assert cluster.host == LOOPBACK and cluster.device_resource() == ("GPU", 8)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 1
    finally:
        cluster.shutdown()


def test_a_ray_that_misses_its_start_up_wait_is_one_line_naming_the_load(monkeypatch, tmp_path):
    """Ray's raylet has a fixed 30 s to register; on an overloaded machine ``ray.init`` raises a bare
    Exception. realm says what happened in one line (PlacementError), and ``train.py`` prints it as its
    ``error:`` line (TrainingError) instead of a traceback."""
    from runtime.placement import RAY_START_TIMEOUT, start_timeout_message
    from trainer.loop import TrainingError, _attempt

    message = start_timeout_message(61.24, 2)
    assert message.startswith("Ray's local node did not start within Ray's 30 s (1-minute load 61.2 on 2 cores)")

    def overloaded(**_):
        raise Exception(f"The current node {RAY_START_TIMEOUT}. This could happen because some of the raylet ...")

    monkeypatch.setattr("runtime.placement.ray.init", overloaded)
    with pytest.raises(PlacementError, match=r"^Ray's local node did not start within Ray's 30 s \(1-minute load"):
        RayCluster.start("", num_cpus=1, num_cpu_devices=1, record=tmp_path / "processes.json")

    def other(**_):
        raise Exception("something else")

    monkeypatch.setattr("runtime.placement.ray.init", other)
    with pytest.raises(Exception, match="^something else$"):  # only Ray's start-up wait is translated
        RayCluster.start("", num_cpus=1, num_cpu_devices=1)

    monkeypatch.setattr("runtime.placement.ray.init", overloaded)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_train_config(compose(config_name="train"))
    with pytest.raises(TrainingError, match=r"^Ray's local node did not start"):
        _attempt(cfg, tmp_path, prepared=None, restarts=[])  # type: ignore[arg-type]  # fails before using it


def test_a_worker_killed_by_rays_memory_monitor_is_a_lost_worker_with_the_nodes_usage():
    """Ray's memory monitor raises OutOfMemoryError for the call whose worker it killed; when no device's actor
    is found dead, it is still a lost worker (train.py restarts from the last checkpoint, or stops with one
    line and the resume command), not a traceback."""
    import ray

    from runtime.placement import ActorLost, DevicePool, exit_detail

    text = (
        "Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.1, ID: ab) "
        "was 22.52GB used / 23.54GB limit (0.956766)"
    )
    error = ray.exceptions.OutOfMemoryError(text)
    detail = "killed by Ray's memory monitor: the node ran low on memory (22.52GB used of 23.54GB)"
    assert exit_detail(error) == detail
    pool = DevicePool.__new__(DevicePool)  # no actors: none is found dead
    pool.hosts, pool.companions = {}, {}
    lost = pool._lost(error)
    assert isinstance(lost, ActorLost) and lost.device is None
    assert str(lost) == f"a worker of the run died ({detail})"
    other = ray.exceptions.RayError("something else")
    assert pool._lost(other) is other
