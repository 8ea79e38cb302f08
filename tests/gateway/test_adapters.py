"""`gateway.adapters.Adapters`: names, leases of requests in flight, unload after the last."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.adapters import Adapters
from gateway.errors import ApiError
from tests.gateway.harness import FakeAdapterHost, adapter_folder


@pytest.fixture
def host() -> FakeAdapterHost:
    return FakeAdapterHost()


@pytest.fixture
def adapters(host: FakeAdapterHost, tmp_path: Path) -> Adapters:
    registry = Adapters(host, reserved=("base",))
    registry.load_now("sql", str(adapter_folder(tmp_path / "sql")))
    return registry


def test_load_serves_the_adapter_and_refuses_taken_names(adapters: Adapters,
                                                         host: FakeAdapterHost,
                                                         tmp_path: Path) -> None:
    assert adapters.served() == {"sql": str(tmp_path / "sql")}
    assert "sql" in adapters and "other" not in adapters
    assert host.loaded == {"sql": str(tmp_path / "sql")}
    with pytest.raises(ApiError) as taken:
        adapters.load_now("sql", str(tmp_path / "sql"))
    assert (taken.value.status, taken.value.code) == (400, "lora_adapter_exists")
    with pytest.raises(ApiError) as base:
        adapters.load_now("base", str(tmp_path / "sql"))
    assert (base.value.status, base.value.param) == (400, "lora_name")


def test_a_folder_the_host_refuses_is_400_with_its_reason(adapters: Adapters,
                                                         tmp_path: Path) -> None:
    with pytest.raises(ApiError) as bad:
        adapters.load_now("empty", str(tmp_path))
    assert bad.value.status == 400 and bad.value.code == "invalid_lora_adapter"
    assert "has no adapter_config.json" in bad.value.message
    assert "empty" not in adapters
    adapters.load_now("empty", str(adapter_folder(tmp_path / "now-ok")))  # the name is free


def test_unload_waits_for_the_requests_in_flight(adapters: Adapters,
                                                 host: FakeAdapterHost) -> None:
    first, second = adapters.acquire("sql"), adapters.acquire("sql")
    assert adapters.unload("sql") == 2
    assert "sql" not in adapters and "sql" in host.loaded  # hidden, not yet removed
    with pytest.raises(ApiError) as gone:
        adapters.acquire("sql")
    assert (gone.value.status, gone.value.code) == (404, "model_not_found")
    with pytest.raises(ApiError) as again:
        adapters.unload("sql")
    assert again.value.status == 404
    first.release()
    first.release()  # idempotent
    assert host.removed == []
    second.release()
    assert host.removed == ["sql"] and adapters.in_flight("sql") == 0


def test_loading_a_name_still_being_unloaded_is_409(adapters: Adapters,
                                                   tmp_path: Path) -> None:
    lease = adapters.acquire("sql")
    adapters.unload("sql")
    with pytest.raises(ApiError) as busy:
        adapters.load_now("sql", str(tmp_path / "sql"))
    assert (busy.value.status, busy.value.code) == (409, "lora_adapter_unloading")
    lease.release()
    adapters.load_now("sql", str(tmp_path / "sql"))
    assert "sql" in adapters


def test_unload_without_requests_removes_at_once(adapters: Adapters,
                                                 host: FakeAdapterHost) -> None:
    assert adapters.unload("sql") == 0
    assert host.removed == ["sql"] and adapters.served() == {}


def test_the_base_model_holds_no_lease(adapters: Adapters) -> None:
    lease = adapters.acquire(None)
    assert lease.released
    lease.release()


def test_without_a_host_no_adapter_loads(tmp_path: Path) -> None:
    with pytest.raises(ApiError) as refused:
        Adapters().load_now("sql", str(adapter_folder(tmp_path / "sql")))
    assert "serves no LoRA adapters" in refused.value.message


def test_removal_waits_while_the_scheduler_still_runs_the_adapter(
        adapters: Adapters, host: FakeAdapterHost, tmp_path: Path) -> None:
    """A job can end before the scheduler lets go of its request (an abort in a shared
    plan): the adapter leaves the model at the registry's first call after that."""
    lease = adapters.acquire("sql")
    adapters.unload("sql")
    host.busy_names.add("sql")
    lease.release()
    assert host.removed == [] and adapters.served() == {}
    with pytest.raises(ApiError) as busy:
        adapters.load_now("sql", str(tmp_path / "sql"))
    assert busy.value.status == 409
    host.busy_names.clear()
    assert adapters.served() == {} and host.removed == ["sql"]
    adapters.load_now("sql", str(tmp_path / "sql"))
    assert "sql" in adapters
