"""The registry of Ray replacements (``zbrl.launch.local_ray.registry``) against the INSTALLED
Ray: every replacement still applies (the name it patches is there, with the shape it expects),
the installed Ray is one the registry was checked on and pyproject admits no other; ``plain``
replaces nothing, ``fast`` replaces each and puts it back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from zbrl.config import RunConfig
from zbrl.launch.local_ray import registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", registry.REPLACEMENTS, ids=lambda e: e.name)
def test_each_replacement_applies_to_the_installed_ray(entry: registry.Replacement) -> None:
    """Fails when a Ray upgrade removed or reshaped what ``entry`` replaces: re-check it (fix,
    or drop it: its ``remove_when``) and record the version in its ``checked_on``."""
    reason = dict(registry.canary_report())[entry.name]
    version = registry.installed_ray_version()
    assert reason is None, (
        f"{entry.name} ({entry.replaces}) no longer applies to Ray {version}: {reason}"
    )
    assert ".".join(version.split(".")[:2]) in entry.checked_on, (
        f"Ray {version} is not in {entry.name}.checked_on {entry.checked_on}"
    )


def test_a_canary_fails_when_its_name_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private.node import Node

    monkeypatch.delattr(Node, "start_monitor")
    reason = dict(registry.canary_report())["lean_head"]
    assert reason == "ray._private.node.Node has no start_monitor"
    assert not registry.applies("lean_head")


def test_a_canary_fails_when_a_signature_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import services

    monkeypatch.setattr(services, "start_raylet", lambda redis_address, gcs_address: None)
    reasons = dict(registry.canary_report())
    assert (
        reasons["worker_setup"] == "ray._private.services.start_raylet takes no setup_worker_path"
    )
    assert reasons["fork_server"] == reasons["worker_setup"]


def test_pyprojects_ray_range_is_the_tested_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray,) = [d for d in deps if re.match(r"ray\b", d)]
    floor, newest = registry.TESTED_RAY
    major, minor = newest.split(".")
    assert ray.replace(" ", "") == f"ray>={floor},<{major}.{int(minor) + 1}"
    assert registry.in_tested_range(registry.installed_ray_version())
    assert registry.ALL_CHECKED[0] == floor and registry.ALL_CHECKED[-1] == newest


def test_the_mode_a_start_resolves_to() -> None:
    assert registry.resolve_mode("fast", cluster=True, ray_version="2.60.0")[0] == "plain"
    assert registry.resolve_mode(None, cluster=False, ray_version="2.60.0")[0] == "fast"
    assert registry.resolve_mode(None, cluster=False, ray_version="2.10.0")[0] == "fast"
    assert registry.resolve_mode("plain", cluster=False, ray_version="2.60.0")[0] == "plain"
    mode, why = registry.resolve_mode(None, cluster=False, ray_version="2.61.0")
    assert mode == "plain" and "outside the tested range 2.10-2.60" in why
    assert registry.resolve_mode(None, cluster=False, ray_version="2.9.3")[0] == "plain"
    assert registry.resolve_mode("fast", cluster=False, ray_version="3.0.0")[0] == "fast"


def test_plain_replaces_nothing_and_fast_puts_everything_back() -> None:
    from ray._private import services, utils
    from ray._private.node import Node

    def current() -> dict[str, object]:
        return {
            "ConsolePopen": services.ConsolePopen,
            "start_ray_process": services.start_ray_process,
            "start_raylet": services.start_raylet,
            "get_dashboard_dependency_error": utils.get_dashboard_dependency_error,
            "start_api_server": Node.__dict__["start_api_server"],
            "start_monitor": Node.__dict__["start_monitor"],
        }

    shipped = current()
    with registry.applied("plain") as active:
        assert active == {} and current() == shipped
    with registry.applied("fast") as active:
        assert active == {e.name: True for e in registry.REPLACEMENTS if e.apply is not None}
        inside = current()
        assert all(inside[name] is not shipped[name] for name in shipped), inside
    assert current() == shipped


def test_plain_with_the_fork_server_asked_for_is_refused() -> None:
    with pytest.raises(ValueError, match=r"launch\.local_ray=plain is Ray as it ships"):
        RunConfig.model_validate({"launch": {"local_ray": "plain", "fork_workers": True}})
    cfg = RunConfig.model_validate({"launch": {"local_ray": "plain"}})
    assert cfg.launch.local_ray == "plain" and cfg.launch.fork_workers is None
    assert not registry.use_fork_server("plain", None, cuda_visible=False)
    assert registry.use_fork_server("fast", None, cuda_visible=False)
    assert not registry.use_fork_server("fast", None, cuda_visible=True)
    assert registry.use_fork_server("fast", True, cuda_visible=True)


def test_rays_token_auth_notice_is_dropped_and_its_other_warnings_kept(caplog) -> None:
    """Ray's own notice functions, called inside ``quiet_token_auth_notice``: the one that a new
    local cluster has token authentication is dropped, the one that authentication is off is
    kept, and outside, both are printed as Ray prints them."""
    import logging

    setup = pytest.importorskip("ray._private.authentication.authentication_token_setup")
    from zbrl.launch.ray_setup import quiet_token_auth_notice

    caplog.set_level(logging.WARNING)
    with quiet_token_auth_notice():
        setup._warn_token_auth_enabled()
        setup._warn_token_auth_disabled()
    inside = [r.getMessage() for r in caplog.records]
    caplog.clear()
    setup._warn_token_auth_enabled()
    outside = [r.getMessage() for r in caplog.records]
    assert len(inside) == 1 and inside[0].startswith("Token authentication is disabled")
    assert len(outside) == 1 and "RAY_AUTH_MODE=disabled to opt out" in outside[0]


def test_the_docs_table_lists_every_entry_with_its_checked_versions() -> None:
    text = (ROOT / "docs" / "local-ray.md").read_text()
    rows = {
        line.split("|")[1].strip(" `"): line for line in text.splitlines() if line.startswith("| `")
    }
    for entry in registry.REPLACEMENTS:
        assert entry.name in rows, f"docs/local-ray.md has no row for {entry.name}"
        assert f"| {', '.join(entry.checked_on)} |" in rows[entry.name], entry.name
