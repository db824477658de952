#!/usr/bin/env bash
# The checks and the profile of docs/profile.md on a CUDA GPU, at LLaDA-8B's body (d_model 4096, 32 layers,
# 32 heads, MLP 12288, bfloat16, LLaDA's vocabulary; random weights, nothing downloaded), then the block-causal
# models (LLaDA2.0-mini, SDAR-1.7B, Fast-dLLM v2 1.5B) at their shapes. Nothing depends on
# it: without a GPU it says so and exits 0.
#
# Stages, most important first, each under its own time limit and writing its own files to $OUT (default .),
# so that a stage cut short loses only itself:
#   1. tests/cuda (the engine decides on CUDA as on CPU, every cache mode; the lookahead; the profile itself)
#   2. batch 1, every cache mode, greedy and T=1: decode, the bare loop, and decode with WINO's verification
#   3. batch 8, every cache mode, greedy: decode and the bare loop
#   4. generation length 1024 (blocks of 32), batch 1, greedy, prefix and dual cache: decode and the bare loop
#   5. batch 8, full forwards in query chunks of 128 (memory), greedy, no cache and dual: decode
#   6-8. the block-causal models at their released shapes, every layer (random weights), greedy, cache none
#      and block side by side: decode and the bare block loop; one stage each: LLaDA2.0-mini (20 layers, 256
#      experts top-8; batch 1, generation 128, 2 repeats: its experts run one after the other), SDAR-1.7B
#      (28 layers, block 4) and Fast-dLLM v2 1.5B (28 layers; also its approximate sub-block cache), batch 1 and 8. The limits are estimates (no
#      GPU has run these stages yet); T_LLADA2, T_SDAR, T_FAST change them.
# ADEC (default: adec) is the command. The folders import as adaptive_decoding.* only once installed:
# on a fresh machine run `python3 -m venv .venv && .venv/bin/pip install -e .` first, then
#   PATH=.venv/bin:$PATH PYTHON=.venv/bin/python experiments/gpu_profile.sh
set -uo pipefail
ADEC=${ADEC:-adec}
PY=${PYTHON:-python3}
OUT=${OUT:-.}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_profile: no CUDA device here; run 'adec profile' for the CPU profile" >&2
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
BODY=(--device cuda --dtype bfloat16 --d-model 4096 --layers 32 --heads 32 --mlp-hidden 12288 --repeats 3)
stage() {  # stage NAME SECONDS COMMAND...: run under a limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)"
  tail -n 40 "$OUT/$name.log"
}
stage cuda-tests "${T_TESTS:-150}" "$PY" -m pytest tests/cuda -q -p no:cacheprovider
stage profile-b1 "${T_B1:-170}" $ADEC profile "${BODY[@]}" --batch 1 --loops decode bare verify \
  --json "$OUT/profile-cuda-b1.json"
stage profile-b8 "${T_B8:-110}" $ADEC profile "${BODY[@]}" --batch 8 --temperature 0 --loops decode bare \
  --json "$OUT/profile-cuda-b8.json"
stage profile-g1024 "${T_G1024:-80}" $ADEC profile "${BODY[@]}" --batch 1 --temperature 0 --cache prefix dual \
  --gen-length 1024 --loops decode bare --json "$OUT/profile-cuda-b1-g1024.json"
stage profile-chunk "${T_CHUNK:-60}" $ADEC profile "${BODY[@]}" --batch 8 --temperature 0 --cache none dual \
  --loops decode --query-chunk 128 --json "$OUT/profile-cuda-b8-chunk128.json"
BLOCK=(--device cuda --dtype bfloat16 --temperature 0 --loops decode bare)
stage profile-llada2 "${T_LLADA2:-180}" $ADEC profile --arch llada2 --layers 20 "${BLOCK[@]}" --batch 1 \
  --gen-length 128 --repeats 2 --json "$OUT/profile-cuda-llada2-mini.json"
stage profile-sdar "${T_SDAR:-120}" $ADEC profile --arch sdar --layers 28 "${BLOCK[@]}" --batch 1 8 --repeats 3 \
  --json "$OUT/profile-cuda-sdar-1.7b.json"
stage profile-fast-dllm-v2 "${T_FAST:-90}" $ADEC profile --arch fast_dllm_v2 --layers 28 "${BLOCK[@]}" --batch 1 8 --repeats 3 \
  --cache none block sub_block \
  --json "$OUT/profile-cuda-fast-dllm-v2-1.5b.json"
