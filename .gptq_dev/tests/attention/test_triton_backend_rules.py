"""The Triton backend's host-side rules (pure Python: no GPU needed, so CI runs them): which short-context
decode-graph buckets small batches get, from BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN, the split count each
bucket takes, and the one-line refusals of combinations the kernels do not take."""

import pytest
import torch

from brigade_cuda.attention.decode import choose_num_splits
from brigade_cuda.attention.triton_backend import TritonAttentionBackend, short_graph_lens, single_split_len


@pytest.fixture
def env(monkeypatch):
    def set_env(value: str | None):
        if value is None:
            monkeypatch.delenv("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", raising=False)
        else:
            monkeypatch.setenv("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", value)
        short_graph_lens.cache_clear()
        single_split_len.cache_clear()

    yield set_env
    monkeypatch.delenv("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", raising=False)
    short_graph_lens.cache_clear()
    single_split_len.cache_clear()


@pytest.mark.parametrize("value,batch1,batch64", [
    (None, (512, 2048), (2048,)),  # the default: one 512-token bucket for batches up to 32
    ("0", (2048,), (2048,)),
    ("256,512", (256, 512, 2048), (2048,)),
    ("1024, 256,,", (256, 1024, 2048), (2048,)),
    ("4096", (2048,), (2048,)),  # not below max_model_len: no extra bucket
])
def test_short_buckets_follow_the_variable(env, value, batch1, batch64):
    env(value)
    assert TritonAttentionBackend.decode_graph_seq_lens(1, 2048) == batch1
    assert TritonAttentionBackend.decode_graph_seq_lens(32, 2048) == batch1
    assert TritonAttentionBackend.decode_graph_seq_lens(64, 2048) == batch64


@pytest.mark.parametrize("value", ["abc", "512,-1", "2.5"])
def test_a_bad_value_is_one_clear_error(env, value):
    env(value)
    with pytest.raises(ValueError, match="BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN must be token counts"):
        short_graph_lens()


def test_each_bucket_takes_the_split_count_of_its_length():
    """At batch 1 with 8 KV heads on 132 SMs, the split count is one 64-token tile per split up to 32."""
    assert [choose_num_splits(1, 8, n, 132) for n in (256, 512, 2048)] == [4, 8, 32]


def test_short_contexts_take_one_split_and_their_own_graph_bucket(monkeypatch):
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", "0")  # only the single-split bucket here
    short_graph_lens.cache_clear()
    assert choose_num_splits(1, 8, 300, 132) > 1
    assert choose_num_splits(1, 8, 300, 132, single_split_len=512) == 1
    assert choose_num_splits(1, 8, 513, 132, single_split_len=512) > 1
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN", "512")
    single_split_len.cache_clear()
    try:
        assert TritonAttentionBackend.decode_graph_seq_lens(1, 2048) == (512, 2048)
        assert TritonAttentionBackend.decode_graph_seq_lens(64, 2048) == (2048,)
        assert TritonAttentionBackend.decode_graph_seq_lens(1, 512) == (512,)
    finally:
        monkeypatch.delenv("BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN")
        single_split_len.cache_clear()
    assert TritonAttentionBackend.decode_graph_seq_lens(1, 2048) == (2048,)
    monkeypatch.delenv("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN")
    short_graph_lens.cache_clear()
    assert TritonAttentionBackend.decode_graph_seq_lens(1, 2048) == (512, 2048)  # the default short bucket
    assert TritonAttentionBackend.decode_graph_seq_lens(1, 512) == (512,)


def test_short_graph_bucket_keeps_the_split_choice(monkeypatch):
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", "512")
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN", "128")
    short_graph_lens.cache_clear()
    single_split_len.cache_clear()
    try:
        assert TritonAttentionBackend.decode_graph_seq_lens(1, 2048) == (128, 512, 2048)
        assert TritonAttentionBackend.decode_graph_seq_lens(64, 2048) == (2048,)
        assert choose_num_splits(1, 8, 512, 132) == 8  # the 512 bucket's graph: 8 splits, not 32
    finally:
        for name in ("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", "BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN"):
            monkeypatch.delenv(name)
        short_graph_lens.cache_clear()
        single_split_len.cache_clear()


def test_validate_refuses_with_one_line_reasons():
    assert TritonAttentionBackend.validate(head_size=128, dtype=torch.bfloat16, block_size=16,
                                           device_type="cuda") is None
    for kwargs in (dict(head_size=128, dtype=torch.bfloat16, block_size=16, device_type="cpu"),
                   dict(head_size=128, dtype=torch.float64, block_size=16, device_type="cuda"),
                   dict(head_size=128, dtype=torch.bfloat16, block_size=24, device_type="cuda"),
                   dict(head_size=72, dtype=torch.bfloat16, block_size=16, device_type="cuda")):
        reason = TritonAttentionBackend.validate(**kwargs)
        assert reason and "\n" not in reason and "triton" in reason
