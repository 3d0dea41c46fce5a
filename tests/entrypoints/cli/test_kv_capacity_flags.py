"""``--num-gpu-blocks-override`` and the KV cache's capacity: fewer than one usable block, or too few for
``--max-model-len``, are refused before the model loads, with a hint that never offers a length below 1."""

from __future__ import annotations

import pytest
from cli_runner import assert_one_line, run_main
from remote_server import find_free_port


@pytest.mark.parametrize("blocks", ["1", "0", "-3"])
def test_too_few_kv_blocks_are_refused_up_front(smollm2_path, blocks):
    """Block 0 is the pool's null block (never holds tokens), so the least that can serve is 2 blocks."""
    proc = run_main("serve", str(smollm2_path), "--num-gpu-blocks-override", blocks, "--host", "127.0.0.1",
                    "--port", str(find_free_port()))
    line = assert_one_line(proc, "brigade serve", f"--num-gpu-blocks-override must be at least 2, got {blocks}")
    assert "null block" in line and "tensors from" not in proc.stderr
    from brigade.config import ConfigError
    from brigade.entrypoints.llm import LLM

    with pytest.raises(ConfigError, match="num-gpu-blocks-override must be at least 2"):
        LLM(str(smollm2_path), num_gpu_blocks_override=int(blocks))


def test_a_kv_cache_too_small_for_max_model_len_is_refused_before_the_model_loads(smollm2_path):
    """With --num-gpu-blocks-override the capacity is known before any weight loads: serve's check says so."""
    proc = run_main("serve", str(smollm2_path), "--num-gpu-blocks-override", "2", "--block-size", "16",
                    "--host", "127.0.0.1", "--port", str(find_free_port()))
    line = assert_one_line(proc, "brigade serve", "the KV cache holds 16 tokens (1 usable block of 16)")
    assert line.endswith("or set --max-model-len 16 or less") and "tensors from" not in proc.stderr


@pytest.mark.parametrize("num_blocks", [0, 1])
def test_the_capacity_hint_never_offers_a_max_model_len_below_1(num_blocks):
    """A pool sized from --kv-cache-memory can still come out below 2 blocks: no '--max-model-len 0 or less'."""
    from brigade.config import ConfigError
    from brigade.engine.core import check_kv_capacity

    with pytest.raises(ConfigError) as info:
        check_kv_capacity(num_blocks, 16, 2048)
    message = str(info.value)
    assert "no usable block" in message and "--max-model-len" not in message, message
    assert "at least 2 blocks" in message, message
