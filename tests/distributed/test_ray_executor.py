"""The ray executor on a real local Ray cluster (started by the engine itself, on the CPU, gloo groups): ``-tp 2``
on a tiny random-weight Llama gives transformers' greedy tokens (fp32; the mp executor's tests hold it to the
same tokens) with chunked prefill, preemption and prefix caching; a rank's actor killed with ``ray.kill`` ends
the next generation with an error naming the rank; a placement group the cluster cannot grant is one line
after a bounded wait; shutdown leaves no Ray process and no Ray cluster. A
``RAY_ADDRESS`` that does not answer and a missing Ray are one line each, before anything loads.

Ray's start-up costs several seconds, so one engine does all of the first test. Ray writes its session under
``RAY_TMPDIR``: a fresh short folder per test, removed afterwards (a Unix socket path must stay under 108 bytes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from parallel_check import MAX_TOKENS, PROMPTS, kill_rank_mid_stream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints"))
from cli_runner import assert_one_line, run_cli  # noqa: E402

pytest.importorskip("ray")  # the test extra installs it; brigade[ray] is optional for users

_CHECK = r"""
import json, os, sys
import ray
from brigade import LLM, SamplingParams

def generate(llm, prompts):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3]), ignore_eos=True), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]

model, prompts = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model, tensor_parallel_size=2, distributed_executor_backend="ray", dtype="float32", max_model_len=32,
          skip_tokenizer_init=True, max_num_batched_tokens=8, num_gpu_blocks_override=6, block_size=8,
          enable_prefix_caching=True, async_scheduling=True)
executor = llm.engine.core.executor
out = {"tokens": generate(llm, prompts), "again": generate(llm, prompts[2:]), "kv": llm.get_kv_cache_stats(),
       "preemptions": llm.engine.core.scheduler.num_preemptions_total,
       "methods": [i.start_method for i in executor.worker_info], "places": [i.place for i in executor.worker_info],
       "pids": [i.pid for i in executor.worker_info], "owns_ray": ray.is_initialized()}
from brigade.executor.ray_cluster import reserve_bundles
try:  # the cluster's 2 CPUs are held by the ranks' bundles: 2 more cannot be granted
    reserve_bundles(2, "cpu", timeout_s=2)
    out["placement"] = None
except Exception as exc:
    out["placement"] = f"{type(exc).__name__}: {exc}"
ray.kill(executor.actors[1])
try:
    generate(llm, prompts[:1])
    out["error"] = None
except Exception as exc:
    out["error"] = str(exc)
llm.engine.core.shutdown()
out["ray_after"] = ray.is_initialized()
print(json.dumps(out))
"""


@pytest.fixture
def ray_tmpdir():
    path = tempfile.mkdtemp(prefix="brg-ray-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _left_under(ray_tmpdir: str) -> list[int]:
    """The live processes that run under ``RAY_TMPDIR=ray_tmpdir`` (in their environment) or hold a file open in
    it: everything the test started, Ray's GCS, raylet, agents and actors included (Ray rewrites their command
    lines, which may overwrite the environment too, but its processes keep their log files open)."""
    mark = f"RAY_TMPDIR={ray_tmpdir}".encode()
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not _alive(int(proc.name)):
            continue
        try:
            found = mark in (proc / "environ").read_bytes().split(b"\0") or \
                any(os.readlink(fd).startswith(ray_tmpdir) for fd in (proc / "fd").iterdir())
        except OSError:
            continue
        if found:
            left.append(int(proc.name))
    return left


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
    except OSError:
        return "?"


def _assert_all_gone(ray_tmpdir: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while left := _left_under(ray_tmpdir):
        assert time.monotonic() < deadline, f"processes left: {[(p, _cmdline(p)) for p in left]}"
        time.sleep(0.2)


def test_ray_tp2_matches_transformers_and_names_a_killed_rank(tiny_llama, ray_tmpdir):
    path, refs, _ = tiny_llama
    env = {**os.environ, "RAY_TMPDIR": ray_tmpdir}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(path), json.dumps(PROMPTS), str(MAX_TOKENS)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tokens"] == refs
    assert got["again"] == refs[2:]
    assert got["preemptions"] > 0  # the 6-block pool cannot hold the three requests at once
    assert got["kv"]["num_free_blocks"] == got["kv"]["num_total_blocks"], got["kv"]
    assert got["methods"] == ["ray", "ray"]
    assert "tp 0/2" in got["places"][0] and "tp 1/2" in got["places"][1]
    assert os.getpid() not in got["pids"] and len(set(got["pids"])) == 2  # two actor processes
    assert got["owns_ray"] and not got["ray_after"], "the engine started the local cluster and leaves it"
    assert "worker rank 1 (Ray actor on " in got["error"] and f"pid {got['pids'][1]}) killed by ray.kill" in \
        got["error"], got["error"]
    assert got["placement"] == ("ConfigError: the Ray cluster did not grant 2 bundles of {'CPU': 1} (one per rank) in "
                                "2 s; 0 CPU(s) are free: add nodes or lower -tp x -pp"), got["placement"]
    assert not any(_alive(pid) for pid in got["pids"])
    folders = [p.name for p in Path(ray_tmpdir, "ray").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(folders) == 1, folders  # the one cluster's (the fixture removes it)
    _assert_all_gone(ray_tmpdir)  # the actors, and Ray's GCS, raylet and agents


def test_silent_ray_address_is_one_line(tiny_llama):
    path, _, _ = tiny_llama
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run_cli("serve", str(path), "--skip-tokenizer-init", "-tp", "2", "--distributed-executor-backend", "ray",
                   env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert_one_line(proc, "brigade serve", f"RAY_ADDRESS=127.0.0.1:{port} does not answer")


def test_missing_ray_is_one_line(tiny_llama):
    """Without Ray importable, the line names the extra to install."""
    path, _, _ = tiny_llama
    code = ("import sys; sys.modules['ray'] = None; from brigade.entrypoints.cli.main import main; "
            f"sys.argv = ['brigade', 'serve', {str(path)!r}, '--skip-tokenizer-init', '-tp', '2', "
            "'--distributed-executor-backend', 'ray']; "
            "sys.exit(main())")
    base = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=base)
    assert_one_line(proc, "brigade serve", "install brigade[ray]")


def test_killed_actor_process_fails_the_stream_and_the_server_exits(tiny_llama, ray_tmpdir):
    """``brigade serve -tp 2 --distributed-executor-backend ray``: rank 1's actor process killed (SIGKILL)
    mid-stream ends the stream with an error event; the server exits 1 with one line naming the rank, and no
    process of the server, of its actors or of its Ray cluster is left."""
    from remote_server import RemoteServer

    path, _, _ = tiny_llama
    env = {"RAY_TMPDIR": ray_tmpdir, "RAY_ADDRESS": ""}
    server = RemoteServer(path, ["--skip-tokenizer-init", "-tp", "2", "--distributed-executor-backend", "ray",
                                 "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "128",
                                 "--disable-log-requests"], env=env)
    try:
        placed = re.search(r"started 2 Ray actor\(s\): rank 0 on \S+ pid (\d+), rank 1 on \S+ pid (\d+)",
                           server.log_tail(200_000))
        assert placed, server.log_tail()
        pids = [int(placed.group(1)), int(placed.group(2))]
        body = {"model": "tiny", "prompt": [1, 5, 7, 9], "max_tokens": 100, "ignore_eos": True, "stream": True}
        last = kill_rank_mid_stream(server, body, pids[1])
        assert last.startswith("brigade serve: error: the engine died (") and \
            "worker rank 1 (Ray actor on " in last and f"pid {pids[1]}) died" in last, last
    finally:
        server.stop()
    _assert_all_gone(ray_tmpdir)
