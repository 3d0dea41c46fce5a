"""The ray executor on two GPUs (NCCL, CUDA graphs around the collectives): ``-tp 2`` on a local Ray cluster gives
transformers' greedy tokens (fp32), each actor on its own GPU with both of its node's GPUs visible. Runs where
CUDA shows two devices and Ray is installed."""

from __future__ import annotations

import pytest
from parallel_check import run_check
from test_tensor_parallel_gpu import GPUS, gpu_llama  # noqa: F401 - the module's fixture, shared

pytest.importorskip("ray")


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
def test_ray_tp2_on_two_gpus_matches_transformers(gpu_llama):  # noqa: F811
    path, refs = gpu_llama
    got = run_check(path, "spawn", "auto", "2x1", block_size=16, max_model_len=64, num_gpu_blocks_override=32,
                    max_num_batched_tokens=64, distributed_executor_backend="ray")["2x1"]
    assert got["tokens"] == refs and got["again"] == refs[2:]
    assert got["kv"]["num_free_blocks"] == got["kv"]["num_total_blocks"]
    assert got["methods"] == ["ray", "ray"]
    assert [p.split(":")[0] for p in got["places"]] == ["rank 0/2 (local rank 0, device cuda:0)",
                                                        "rank 1/2 (local rank 1, device cuda:1)"]
