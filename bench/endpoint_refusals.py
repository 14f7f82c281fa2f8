"""How ``zbrl serve`` answers a hostile client: each malformed request's status, code and time,
against a real ``zbrl serve`` process on loopback over a checkpoint (docs/agents.md, Endpoint
errors and limits).

    python bench/endpoint_refusals.py runs/demo/checkpoints/step-20

It first checks that ``zbrl serve --host 0.0.0.0`` without a key refuses to start (and how long
that takes: it must refuse before loading the model or binding), then starts ``zbrl serve
--api-key`` on 127.0.0.1 and sends each case on its own connection, then a good request after
each (the server must still answer). Prints one table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

KEY = "bench-key"
FLAGS = ("--api-key", KEY, "--max-request-bytes", str(4 * 2**20))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, str, float]:
    """(status, error code or "", seconds) of one POST on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start = time.perf_counter()
    try:
        conn.putrequest("POST", "/v1/chat/completions", skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        if headers.get("Content-Length", "").isdigit():
            conn.send(body)
        response = conn.getresponse()
        payload = json.loads(response.read() or b"{}")
    finally:
        conn.close()
    took = time.perf_counter() - start
    return response.status, (payload.get("error") or {}).get("code", ""), took


def chat(content: str, **fields) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], **fields}).encode()


def cases() -> list[tuple[str, bytes, dict[str, str]]]:
    auth = {"Authorization": f"Bearer {KEY}"}
    good = chat("1+2", max_tokens=4)

    def sized(body: bytes, **extra: str) -> dict[str, str]:
        return {**auth, "Content-Length": str(len(body)), **extra}

    huge = chat("7" * 200_000)
    hot = chat("1+2", temperature="hot")
    return [
        ("good request", good, sized(good)),
        ("200,000-character message", huge, sized(huge)),
        ('temperature: "hot"', hot, sized(hot)),
        ("Content-Length: abc", good, {**auth, "Content-Length": "abc"}),
        ("body over --max-request-bytes", good, {**auth, "Content-Length": str(64 * 2**20)}),
        ("no API key", good, {"Content-Length": str(len(good))}),
    ]


def open_host_refusal(model: str) -> tuple[int, float, str]:
    env = {k: v for k, v in os.environ.items() if k != "ZBRL_API_KEY"}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "zbrl.cli", "serve", model, "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return out.returncode, time.perf_counter() - start, out.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a checkpoint or model directory")
    args = parser.parse_args()
    code, took, line = open_host_refusal(args.model)
    print(f"zbrl serve --host 0.0.0.0 (no key): exit {code} after {took:.2f} s: {line[:90]}...")
    port = free_port()
    log = Path(f"/tmp/zbrl-serve-{port}.log")
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "zbrl.cli", "serve", args.model, "--port", str(port), *FLAGS],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while "serving" not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"zbrl serve did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        print("\n| request | status | code | seconds | next good request |\n|---|---|---|---|---|")
        for name, body, headers in cases():
            status, code, took = request(port, body, headers)
            good = cases()[0]
            after = request(port, good[1], good[2])[0]
            print(f"| {name} | {status} | {code or '-'} | {took:.3f} | {after} |")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
