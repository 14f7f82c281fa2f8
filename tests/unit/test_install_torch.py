"""tools/install_torch.py, which the Makefile runs first in every venv: the probe that picks
PyTorch's CPU index or the default one (README, "Before you start")."""

import http.server
import importlib.util
import socket
import threading
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "install_torch.py"


@pytest.fixture(scope="module")
def install_torch():
    spec = importlib.util.spec_from_file_location("install_torch", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_index_that_answers_is_reachable(install_torch):
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert install_torch.index_reachable(url, timeout_s=5.0)
    finally:
        server.shutdown()
        server.server_close()


def test_a_closed_port_or_an_unknown_host_is_unreachable(install_torch):
    with socket.socket() as s:  # a port nobody listens on: bind, note it, close
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not install_torch.index_reachable(f"http://127.0.0.1:{port}", timeout_s=5.0)
    assert not install_torch.index_reachable("http://no-such-host.invalid", timeout_s=5.0)


def test_a_silent_server_is_unreachable(install_torch):
    with socket.socket() as s:  # accepts the connection (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert not install_torch.index_reachable(f"http://127.0.0.1:{s.getsockname()[1]}", 0.2)
