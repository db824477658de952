#!/usr/bin/env bash
# The profile of docs/profile.md on a CUDA GPU, at LLaDA-8B's body (d_model 4096, 32 layers, 32 heads, MLP 12288,
# LLaDA's vocabulary; random weights, nothing downloaded). Nothing depends on it: without a GPU it
# says so and exits 0. Extra arguments go to `adec profile` (e.g. --batch 1 --cache dual).
set -euo pipefail
ADEC=${ADEC:-adec}
PY=${PYTHON:-python3}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_profile: no CUDA device here; run 'adec profile' for the CPU profile" >&2
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$ADEC" profile --device cuda --dtype bfloat16 --d-model 4096 --layers 32 --heads 32 --mlp-hidden 12288 \
  --batch 1 8 --loops decode bare verify --repeats 3 --json "${OUT:-.}/profile-cuda.json" "$@"
# the same with full forwards in query chunks (memory: docs/profile.md), greedy, decode only
"$ADEC" profile --device cuda --dtype bfloat16 --d-model 4096 --layers 32 --heads 32 --mlp-hidden 12288 \
  --batch 1 8 --loops decode --temperature 0 --query-chunk 128 --repeats 3 --json "${OUT:-.}/profile-cuda-chunk128.json" "$@"
