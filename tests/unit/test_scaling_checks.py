"""Bad scaling input is refused before anything starts, with the field and the fix named."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from zbrl.config import load_config
from zbrl.errors import RunError
from zbrl.launch.driver import run_training
from zbrl.launch.preflight import check_broadcast_address, check_nccl_gpus, preflight
from zbrl.transport.weight_sync.broadcast import check_bindable

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def _cfg(*overrides: str):
    return load_config(DEMO, list(overrides))


def test_nccl_without_gpus_is_refused():
    with pytest.raises(ValueError, match=r"backend=nccl.*launch.consumer_num_gpus=0.*backend=gloo"):
        _cfg("transport.weight_sync.type=broadcast", "transport.weight_sync.backend=nccl")


def test_auto_picks_nccl_for_gpu_consumers_and_then_producers_need_gpus_too():
    with pytest.raises(ValueError, match=r"auto picks nccl.*producer_num_gpus=0"):
        _cfg("transport.weight_sync.type=broadcast", "launch.consumer_num_gpus=1")


def test_a_local_run_keeps_the_broadcast_on_loopback():
    with pytest.raises(ValueError, match=r"transport.weight_sync.address='10.1.2.3'.*127.0.0.1"):
        _cfg("transport.weight_sync.type=broadcast", "transport.weight_sync.address=10.1.2.3")


def test_the_bucket_follows_the_backend_unless_set():
    from zbrl.assembly.settings import broadcast_settings

    gloo = broadcast_settings(_cfg("transport.weight_sync.type=broadcast"), "127.0.0.1")
    assert gloo.backend == "gloo" and gloo.bucket_bytes == 4 * 2**20
    assert gloo.address == "127.0.0.1"
    nccl = _cfg(
        "transport.weight_sync.type=broadcast",
        "launch.consumer_num_gpus=1",
        "launch.producer_num_gpus=1",
    )
    assert broadcast_settings(nccl, "10.0.0.1").bucket_bytes == 64 * 2**20
    assert broadcast_settings(nccl, "10.0.0.1").backend == "nccl"
    sized = _cfg("transport.weight_sync.type=broadcast", "transport.weight_sync.bucket_mb=0.5")
    assert broadcast_settings(sized, "127.0.0.1").bucket_bytes == 2**19
    assert broadcast_settings(_cfg(), "127.0.0.1") is None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_that_does_not_answer_is_refused_before_a_run_dir_exists(tmp_path):
    run_dir = tmp_path / "run"
    cfg = _cfg(f"launch.ray_address=127.0.0.1:{_closed_port()}", f"logging.run_dir={run_dir}")
    with pytest.raises(
        RunError, match=r"launch.ray_address='127.0.0.1:\d+' does not answer.*ray start --head"
    ):
        run_training(cfg)
    assert not run_dir.exists()


def test_a_ray_address_that_is_not_host_port_is_refused():
    with pytest.raises(RunError, match=r"launch.ray_address='headnode' is not HOST:PORT"):
        preflight(_cfg("launch.ray_address=headnode"))


def test_a_broadcast_address_that_does_not_resolve_is_refused():
    cfg = _cfg(
        "launch.ray_address=127.0.0.1:6379",
        "transport.weight_sync.type=broadcast",
        "transport.weight_sync.address=no-such-host.invalid",
    )
    with pytest.raises(
        RunError, match=r"transport.weight_sync.address='no-such-host.invalid' does not resolve"
    ):
        check_broadcast_address(cfg)


def test_the_sender_refuses_an_address_that_is_not_its_nodes():
    with pytest.raises(
        ValueError, match=r"transport.weight_sync.address='192.0.2.1' is not an address"
    ):
        check_bindable("192.0.2.1")  # TEST-NET-1: never assigned to a machine
    check_bindable("127.0.0.1")


def test_nccl_on_a_machine_without_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = _cfg(
        "transport.weight_sync.type=broadcast",
        "transport.weight_sync.backend=nccl",
        "launch.consumer_num_gpus=1",
        "launch.producer_num_gpus=1",
    )
    with pytest.raises(RunError, match=r"resolves to nccl.*no CUDA GPU.*backend=gloo"):
        check_nccl_gpus(cfg)
