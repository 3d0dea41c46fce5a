"""Expert load in /metrics, and the start-up refusals of MoE settings Brigade cannot run.

A real ``brigade serve -tp 2 --enable-expert-parallel`` (mp executor, gloo), and ``-dp 2 --enable-expert-parallel``
(two lockstep engines sharing the experts), on a tiny random-weight Qwen2-MoE each answer one greedy request of the ``openai`` client with transformers' tokens; ``brigade:moe_expert_tokens_total``
then holds, per layer and expert, exactly the assignments transformers' own routers make on the tokens that went
through the model (the prompt and every output token but the last), which sum to tokens x top_k per layer. Bad
settings are one line on stderr and exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from moe_checkpoints import greedy_reference, moe_config, num_experts, save_moe_checkpoint

from brigade.config import ConfigError
from brigade.entrypoints.cli import serve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoints"))
from cli_runner import assert_one_line, run_cli, serve_args  # noqa: E402
from remote_server import RemoteServer  # noqa: E402

PROMPT = [101, 2040, 17, 9000, 345, 12, 77, 4242, 31, 8, 600, 7]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory, smollm2_path):
    """(path, config, transformers' greedy tokens on PROMPT, expected counts: layer -> tokens per expert)."""
    config = moe_config("qwen2-moe")
    path = tmp_path_factory.mktemp("qwen2-moe")
    model = save_moe_checkpoint(config, path, tokenizer_dir=smollm2_path)
    tokens = greedy_reference(model, [PROMPT], MAX_TOKENS)[0]
    forwarded = torch.tensor([PROMPT + tokens[:-1]])
    with torch.inference_mode():
        router_logits = model(forwarded, output_router_logits=True).router_logits  # per sparse layer [T, E]
    counts = {}
    for layer, logits in enumerate(router_logits):
        ids = torch.topk(torch.softmax(logits.float(), dim=-1), config.num_experts_per_tok, dim=-1).indices
        counts[layer] = torch.bincount(ids.flatten(), minlength=num_experts(config)).tolist()
    return path, config, tokens, counts


def _expert_series(metrics: str) -> dict[int, dict[int, float]]:
    """layer -> expert -> value of brigade:moe_expert_tokens_total in a /metrics text."""
    series: dict[int, dict[int, float]] = {}
    for line in metrics.splitlines():
        if line.startswith("brigade:moe_expert_tokens_total{"):
            labels = dict(part.split("=") for part in line[line.index("{") + 1:line.index("}")].split(","))
            layer, expert = int(labels["layer"].strip('"')), int(labels["expert"].strip('"'))
            series.setdefault(layer, {})[expert] = float(line.split()[-1])
    return series


@pytest.mark.parametrize("layout", [["-tp", "2"], ["-dp", "2"]], ids=["tp2", "dp2"])
def test_metrics_count_the_tokens_routed_to_each_expert(qwen2_moe, layout):
    """Under ``-dp 2`` the request runs on one engine while the other runs dummy batches, whose tokens count
    nowhere; each engine counts its own tokens before the dispatch, so the sum is transformers' routing too."""
    path, config, tokens, counts = qwen2_moe
    srv = RemoteServer(path, ["--dtype", "float32", *layout, "--enable-expert-parallel", "--max-model-len", "32",
                              "--block-size", "8", "--num-gpu-blocks-override", "9", "--served-model-name", "tiny-moe",
                              "--disable-log-requests"],
                       env={"BRIGADE_WORKER_MULTIPROC_METHOD": "fork"})  # forked from the engine: no re-import
    try:
        completion = srv.openai_client().completions.create(model="tiny-moe", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                            temperature=0.0, extra_body={"ignore_eos": True})
        metrics = httpx.get(srv.url("/metrics"), timeout=10).text
    finally:
        srv.stop()
    assert completion.choices[0].text == transformers.AutoTokenizer.from_pretrained(str(path)).decode(tokens)
    assert completion.usage.completion_tokens == MAX_TOKENS
    series = _expert_series(metrics)
    assert sorted(series) == [0, 1], series
    for layer, want in counts.items():
        got = [series[layer][e] for e in range(num_experts(config))]
        assert got == want, (layer, got, want)
        assert sum(got) == (len(PROMPT) + MAX_TOKENS - 1) * config.num_experts_per_tok


@pytest.mark.parametrize("argv,needle", [
    (["-tp", "4", "--enable-expert-parallel"],
     "Qwen2Moe: 6 experts do not divide over the expert-parallel group of 4 ranks (-tp 4 with "
     "--enable-expert-parallel)"),
    (["--enable-lora"], "Qwen2Moe: LoRA on mixture-of-experts models is not supported"),
    # Experts spread over the DP x TP ranks: 6 experts over -dp 4 do not divide (-dp 2 is served).
    (["--enable-expert-parallel", "-dp", "4"],
     "Qwen2Moe: 6 experts do not divide over the expert-parallel group of 4 ranks (-dp 4 x -tp 1 with "
     "--enable-expert-parallel)"),
    (["--enable-expert-parallel", "-dp", "2", "--distributed-executor-backend", "ray"],
     "--enable-expert-parallel with -dp 2 runs on the uni or mp executor"),
])
def test_unsupported_moe_settings_are_refused_by_serves_checks(qwen2_moe, argv, needle):
    """``brigade serve``'s checks, in-process (the next test runs the command itself)."""
    with pytest.raises(ConfigError) as info:
        serve.check(serve_args(str(qwen2_moe[0]), *argv))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_serialized_fp8_moe_checkpoint_is_one_line_before_loading(qwen2_moe, tmp_path):
    """A ``quant_method: fp8`` MoE checkpoint has per-expert FP8 tensors Brigade does not load yet: refused in one
    line naming the way that works (online ``--quantization fp8``), before any weight is read."""
    import json

    src = Path(qwen2_moe[0])
    for file in src.iterdir():
        (tmp_path / file.name).symlink_to(file)
    (tmp_path / "config.json").unlink()
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = run_cli("serve", str(tmp_path))
    assert_one_line(proc, "brigade serve", "Qwen2Moe: quantized mixture-of-experts checkpoints (fp8) are not "
                                           "supported yet; serve the unquantized checkpoint, with --quantization fp8")
    assert "tensors from" not in proc.stderr  # refused before any weight was read


def test_expert_parallel_on_a_dense_model_is_one_line(smollm2_path):
    proc = run_cli("serve", str(smollm2_path), "--enable-expert-parallel")
    assert_one_line(proc, "brigade serve", "--enable-expert-parallel applies to mixture-of-experts models; "
                                           "LlamaForCausalLM has no experts")
