"""The server on a GPU under load: ``python -m megakernel.serve`` with random weights of the true
0.6b and 8b shapes, batch 16, the megakernel backend; the load generator's 32 concurrent streaming
clients for a minute (``SERVE_LOAD_SECONDS`` changes it), with nothing failed or lost.
``SERVE_RECORD=bench/results.jsonl`` records each run's figures in the results table."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO


def _up(url: str) -> bool:
    import httpx
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.gpu
@pytest.mark.parametrize("size", ["0.6b", "8b"])
def test_load_32_streaming_clients_nothing_failed(size, capsys):
    pytest.importorskip("fastapi")
    from megakernel import loadtest
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "megakernel.serve", "--model", size, "--random-weights", "--batch-size", "16",
           "--port", "0"]
    p = subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    log, where = collections.deque(maxlen=50), []

    def drain():   # the server logs every request: its pipe must never fill
        for line in p.stderr:
            log.append(line)
            found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", line)
            if found:
                where.append(found.group(1))
    threading.Thread(target=drain, daemon=True).start()
    try:
        end = time.monotonic() + 1800   # random weights are made once and cached; the first step compiles
        while not where and p.poll() is None and time.monotonic() < end:
            time.sleep(0.5)
        assert where, "the server did not start:\n" + "".join(log)
        url = where[0]
        end = time.monotonic() + 120
        while not _up(url) and time.monotonic() < end:
            time.sleep(0.5)
        seconds = os.environ.get("SERVE_LOAD_SECONDS", "60")
        record = ["--record", os.environ["SERVE_RECORD"]] if os.environ.get("SERVE_RECORD") else []
        rc = loadtest.main(["--url", url, "--concurrency", "32", "--duration", seconds, "--max-tokens", "128",
                            "--prompt-tokens", "64", "--json", *record])
        out = capsys.readouterr().out
        with capsys.disabled():
            print(f"\n{size}:\n" + "\n".join(out.strip().splitlines()[:-1]))
        assert rc == 0, out + "".join(log)
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
