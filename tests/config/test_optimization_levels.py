"""-O levels do what --help says: -O0 and -O1 are the same eager engine, -O2 and -O3 capture CUDA graphs (FULL),
-O3 with larger capture sizes; and ``from brigade.config import ...`` still names every public config."""

from __future__ import annotations

import pytest

import brigade.config
from brigade.config import CompilationConfig, config_from_kwargs
from brigade.worker.cuda_graph import default_capture_sizes
from brigade.worker.mixed_graph import default_mixed_sizes


@pytest.mark.parametrize("level,mode", [(0, "NONE"), (1, "NONE"), (2, "FULL"), (3, "FULL")])
def test_each_level_resolves_to_the_documented_graph_mode(level, mode):
    assert CompilationConfig(level=level).resolved_cudagraph_mode(enforce_eager=False) == mode


def test_o3_only_widens_the_capture_sizes():
    assert default_capture_sizes(64, 2) == default_capture_sizes(64, 1) == default_capture_sizes(64, 0)
    assert max(default_capture_sizes(64, 2)) == 64 and max(default_capture_sizes(64, 3)) == 512
    assert max(default_mixed_sizes(8192, 2)) == 512 and max(default_mixed_sizes(8192, 3)) == 1024


def test_the_help_says_what_each_level_does():
    import argparse

    from brigade.entrypoints.cli.engine_args import add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser, {"quantization": [], "attention_backend": [], "kv_connector": [], "io_processor": []})
    (help_text,) = [a.help for a in parser._actions if "-O" in a.option_strings]
    assert "-O0 and -O1: eager, no CUDA graphs (no level runs torch.compile)" in help_text
    assert "-O2: CUDA graphs" in help_text and "-O3: -O2 with larger capture sizes" in help_text


def test_the_package_keeps_every_public_name():
    for name in brigade.config.__all__:
        assert getattr(brigade.config, name) is not None
    config = config_from_kwargs("m", compilation_config=1, max_num_seqs=4)
    assert config.compilation_config.level == 1 and config.scheduler_config.max_num_seqs == 4
    assert not hasattr(config, "compute_hash")
