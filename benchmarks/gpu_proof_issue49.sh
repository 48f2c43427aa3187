#!/usr/bin/env bash
# Issue 49, item 6: the GPU proof finished in one command of at most ten minutes on one lent GPU (docs/scaling.md,
# "The GPU proof"). Learning shown (the loss of one preset per head falls over 20 steps at lr 1e-4), GPU against CPU
# agreement of every head's scores on the same weights and inputs (tolerance per dtype: float32 1e-5, TF32 1e-2,
# relative to the largest score), and the throughput (clips/s) of one AMP training step per head at the papers'
# batch 128 on one GPU, plain and with gradient checkpointing; the environment part records which torch the machine
# had. Runs with the machine's own python and torch, tvr from this checkout on PYTHONPATH (nothing is installed).
#   bash benchmarks/gpu_proof_issue49.sh            # writes $OUT/gpu_proof_issue49.json (or benchmarks/results/)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}/gpu_proof_issue49.json"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 570 python benchmarks/gpu_proof.py \
    --parts learning,agreement,steps \
    --learning-presets clip4clip/msrvtt,gare/msrvtt,proxy/msrvtt,gravialign/msrvtt --learning-steps 20 \
    --presets clip4clip/msrvtt,gare/msrvtt,proxy/msrvtt,gravialign/msrvtt --batch 128 --amp-dtypes bf16 \
    --checkpointing --agreement-size 256 --out "$out"
