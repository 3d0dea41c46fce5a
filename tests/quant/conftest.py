"""Fixtures of the quantization tests: GPTQ checkpoints of the real SmolLM2 weights and their references."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoints"))  # remote_server, CLI helpers

from gptq_checkpoint import (GPTQSpec, quantize_model, write_dequantized_checkpoint,  # noqa: E402
                             write_gptq_checkpoint)

# The end-to-end flavours: between them group sizes 128 and -1, desc_act true (permuted g_idx) and false, asym and
# sym, 4 and 8 bits, at two engine start-ups (about 12 s each on two cores). Every other combination runs at the
# layer level in test_gptq_format.py, where the same code paths are checked against a float64 product.


@pytest.fixture(scope="session")
def gptq_checkpoints(tmp_path_factory, smollm2_path):
    """``make(spec) -> (gptq_dir, reference_dir)``: SmolLM2 quantized to ``spec`` (written once per session), and
    the same codes dequantized to float32 in an ordinary checkpoint without quantization_config (the end-to-end
    test deletes it once transformers has loaded it: 0.5 GB each)."""
    made: dict[GPTQSpec, tuple[Path, Path]] = {}

    def make(spec: GPTQSpec) -> tuple[Path, Path]:
        if spec not in made:
            root = tmp_path_factory.mktemp(spec.id)
            layers = quantize_model(Path(smollm2_path), spec)
            made[spec] = (write_gptq_checkpoint(Path(smollm2_path), root / "gptq", spec, layers=layers),
                          write_dequantized_checkpoint(Path(smollm2_path), root / "reference", layers))
        return made[spec]

    yield make
    for gptq_dir, _ in made.values():
        shutil.rmtree(gptq_dir.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def awq_checkpoint(tmp_path_factory, smollm2_path):
    """``(awq_dir, reference_dir)``: SmolLM2 quantized to AWQ (4-bit, group 64, AutoAWQ's GEMM packing) by
    ``awq_checkpoint``, and the same codes dequantized to float32 in an ordinary checkpoint."""
    from awq_checkpoint import E2E_GROUP_SIZE, quantize_model as quantize_awq_model
    from awq_checkpoint import write_awq_checkpoint

    root = tmp_path_factory.mktemp("awq")
    layers = quantize_awq_model(Path(smollm2_path), E2E_GROUP_SIZE)
    made = (write_awq_checkpoint(Path(smollm2_path), root / "awq", E2E_GROUP_SIZE, layers),
            write_dequantized_checkpoint(Path(smollm2_path), root / "reference", layers))
    del layers
    yield made
    shutil.rmtree(root, ignore_errors=True)
