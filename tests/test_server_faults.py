"""A dead generation server (core/rollout/server.py, docs/reliability.md): every request to a server has a timeout
(``rollout.server.request_timeout_s``), a hung server fails the request once instead of hanging the run, and a
stand-in server (tests/vllm_server_double.py) killed mid-run fails the job non-zero with a message naming its URL
and what to do; once the server is back, ``resume=auto`` finishes the run with each step once and one results row."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core.models.loading import model_dir
from core.paths import PROJECT_ROOT
from core.rollout.server import GenerationServerError, bound_requests, naming
from tests.helpers import CLI_ENV, FAST, cli_command, results, run_cli
from tests.test_rollout_server import CLIENT, MODEL, _free_ports


class _Hung(BaseHTTPRequestHandler):
    """A server that is up (``/health``, ``/v1/models`` answer) but never answers a POST: a hung ``vllm serve``."""

    posts: list = []
    release = threading.Event()

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        _Hung.posts.append(self.path)
        _Hung.release.wait(30)


def test_a_hung_server_fails_one_request_within_its_timeout_naming_the_server():
    from tests.vllm_server_double import GlooVLLMClient

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hung)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = GlooVLLMClient(base_url=url, connection_timeout=5.0)  # TRL's client, its retries as TRL sets them
        bound_requests(client.session, 0.5)
        start = time.monotonic()
        with pytest.raises(GenerationServerError, match=rf"the generation server at {url} failed mid-run .*"
                                                        r"request_timeout_s.* resume=auto"):
            naming(url, client.generate, [[1, 2, 3]], n=1, max_tokens=4)
        assert time.monotonic() - start < 5  # TRL's client alone would wait forever, and re-post a read timeout 5 times
        assert _Hung.posts == ["/v1/completions"]  # posted once: a timed-out generation is not re-sent
    finally:
        _Hung.release.set()
        server.shutdown()


def _serve(path: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.vllm_server_double", path, "--port", str(port)],
                            cwd=PROJECT_ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.3)


def _steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "reward/mean" in r]


@pytest.mark.slow
def test_a_server_killed_mid_run_fails_the_job_naming_it_and_resume_finishes_it(tmp_path):
    """The server is killed (SIGKILL) while step 3 is scored; step 3 trains and checkpoints, step 4's weight push
    finds no server: the job exits non-zero naming the URL. A server started again on the port, ``resume=auto``
    continues from step 3."""
    path, port = model_dir(MODEL), _free_ports(1)[0]
    server = _serve(path, port)
    run = [*FAST, "train.total_steps=5", "train.checkpoint_every=1", "train.warm_start.steps=0",
           "layout=dedicated", "layout.gpus_per_node=2", "layout.learner_gpus=1", "rollout=vllm_server",
           "rollout.server.hosts=[127.0.0.1]", f"rollout.server.port={port}", f"rollout.server.client={CLIENT}",
           "rollout.server.request_timeout_s=30", f"model.name_or_path={path}", "device=cpu",
           "verifier.name=tests.stub_rewards:math_signalled_after"]
    url = f"http://127.0.0.1:{port}"
    try:
        env = {**CLI_ENV, "RLR_TEST_SIGNAL": f"{tmp_path}/run/metrics.jsonl:2:SIGKILL:pid{server.pid}"}
        group = [f"rollout.server.group_port={_free_ports(1)[0]}"]
        proc = subprocess.run(cli_command(tmp_path, *run, *group), cwd=PROJECT_ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode not in (0, None) and server.wait(5) == -9, out[-3000:]
        assert f"GenerationServerError: the generation server at {url} failed mid-run" in out, out[-3000:]
        assert "resume=auto" in out.splitlines()[-1]
        run_dir = tmp_path / "run"
        assert _steps(run_dir) == [1, 2, 3] and results(tmp_path) == []
        server = _serve(path, port)
        # the server's keys may change on a resume (a new allocation's address), typed with their group: every one
        server_keys = [k for k in run if k.startswith("rollout.server.") and "group_port" not in k]
        resumed = run_cli(tmp_path, "resume=auto", "rollout=vllm_server", *server_keys,
                          f"rollout.server.group_port={_free_ports(1)[0]}", timeout=600)
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
        assert _steps(run_dir) == [1, 2, 3, 4, 5] and [r["steps"] for r in results(tmp_path)] == [5]
    finally:
        server.kill()
        server.wait()
