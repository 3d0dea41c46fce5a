#!/usr/bin/env bash
# Session 6, last call: the decode graphs' input buffers now start every array at a 64-byte boundary. The
# engine's GPU tests (graph replay against transformers) and the batch-1 latency on that build.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=150 TAIL=3 run python3 -m pytest -q -p no:warnings tests/cuda/test_engine_gpu.py -x
lat aligned_graph_inputs
