#!/usr/bin/env bash
# GPU session 3, call J (the code on main after dropping the RMSNorm fold and the in-kernel merge): every GPU
# test, batch-1 latency with PDL triggering the next kernel after (default) and before its wait, then with the
# faster of the two: latency against HF generate and the two throughput benchmarks of issue 4.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=220 TAIL=6 run python3 -m pytest -q -x tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -2 "$out/roofline.json"
lat() { name=$1; shift; TAIL=3 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_$name.json"; }
lat pdl_after BRIGADE_CUDA_PDL_EARLY=0
lat pdl_before BRIGADE_CUDA_PDL_EARLY=1
tpot() { python3 -c "import json;print(json.load(open('$out/latency_$1.json'))['results']['brigade']['tpot_ms']['median'])"; }
export BRIGADE_CUDA_PDL_EARLY=$(python3 -c "print(int($(tpot pdl_before) < $(tpot pdl_after)))")
echo "BRIGADE_CUDA_PDL_EARLY=$BRIGADE_CUDA_PDL_EARLY for the rest"
TAIL=5 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
TAIL=4 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
TAIL=4 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
