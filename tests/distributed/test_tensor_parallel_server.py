"""``brigade serve -tp 3`` on the real SmolLM2-135M-Instruct (9 heads, 3 KV heads: one KV head per rank), through
the official ``openai`` client: transformers' greedy text with chunked prefill, preemption and prefix caching on,
every KV block back in the pool afterwards, the grid in the start-up log; then one worker is killed mid-stream:
the stream ends with an error event, the server exits with one line naming the rank, and no process is left.

One server for the module (the last test kills it).
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints"))
from parallel_check import kill_rank_mid_stream  # noqa: E402
from remote_server import RemoteServer  # noqa: E402

MODEL = "smollm2"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a kingdom far away, there lived a"]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def server(smollm2_path):
    # 16-token steps chunk the long prompt; 8 usable blocks of 8 tokens cannot hold the three requests (13
    # blocks) at once, so one is preempted and recomputed; prefix caching is on by default.
    server = RemoteServer(smollm2_path, ["--served-model-name", MODEL, "-tp", "3", "--max-model-len", "64",
                                         "--block-size", "8",
                                         "--max-num-batched-tokens", "16", "--num-gpu-blocks-override", "9",
                                         "--dtype", "float32", "--disable-log-requests"],
                          env={"BRIGADE_WORKER_MULTIPROC_METHOD": "fork"})  # spawn is test_tensor_parallel's
    yield server
    server.stop()


def metrics(server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url("/metrics"), timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[re.sub(r"\{.*\}", "", name)] = float(value)
    return out


def test_tp3_serves_transformers_greedy_text(server, hf_reference):
    client = server.openai_client()
    tokenizer = hf_reference.tokenizer
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    expected = [tokenizer.decode(hf_reference.greedy([p], MAX_TOKENS, ignore_eos=True)[0], skip_special_tokens=True)
                for p in ids]

    def complete(prompt: str) -> str:
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body={"ignore_eos": True})
        return out.choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(complete, PROMPTS)) == expected
    assert complete(PROMPTS[-1]) == expected[-1]  # its first prompt block comes from the prefix cache
    m = metrics(server)
    assert m["brigade:num_preemptions_total"] > 0
    assert m["brigade:prefix_cache_hits_total"] > 0
    deadline = time.monotonic() + 20
    while (m := metrics(server))["brigade:kv_cache_usage_perc"] != 0.0:
        assert time.monotonic() < deadline, "KV blocks not returned"
        time.sleep(0.2)
    stats = httpx.get(server.url("/metrics"), timeout=30).text
    assert m["brigade:num_free_blocks"] == 8, stats[-2000:]  # the pool less its null block


def test_start_up_log_states_the_grid_once(server, smollm2_path):
    log = server.log_tail(200_000)
    assert log.count("grid dp 1 x pp 1 x tp 3, 3 ranks, driver rank 0; each rank's KV cache holds 9 blocks") == 1
    for rank in range(3):
        line = f"rank {rank}/3 (local rank {rank}, device cpu): dp 0/1, pp 0/1, tp {rank}/3, pid "
        assert log.count(line) == 1, log[-3000:]
    # Each rank holds about a third of the fp32 model (the norms, 0.1% of it, are whole on every rank).
    from safetensors import safe_open

    with safe_open(str(smollm2_path / "model.safetensors"), framework="pt") as f:
        model_mib = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys()) * 4 / 2**20
    held = [float(m) for m in re.findall(r", pid \d+, ([0-9.]+) MiB of parameters", log)]
    assert len(held) == 3 and all(0.33 < h / model_mib < 0.34 for h in held), (held, model_mib)


def _process_tree(pid: int) -> list[int]:
    out = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            out += _process_tree(int(child))
    return out


def test_killed_worker_fails_the_stream_and_the_server_exits(server):
    placed = re.finditer(r"rank (\d)/3 \(local rank \d, device cpu\): .*?, pid (\d+)", server.log_tail(200_000))
    pids = {int(m.group(1)): int(m.group(2)) for m in placed}
    tree = _process_tree(server.proc.pid)
    assert set(pids.values()) <= set(tree)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 50, "ignore_eos": True, "stream": True}
    last = kill_rank_mid_stream(server, body, pids[1])
    assert last.startswith("brigade serve: error: the engine died (") and \
        f"worker rank 1 (pid {pids[1]}) killed by SIGKILL" in last, last
    deadline = time.monotonic() + 10
    while alive := [p for p in tree if os.path.exists(f"/proc/{p}") and
                    Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]:
        assert time.monotonic() < deadline, f"processes left: {alive}"
        time.sleep(0.2)
