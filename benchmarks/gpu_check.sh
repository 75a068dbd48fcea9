#!/usr/bin/env bash
# The prepared GPU check: the CUDA-only tests, then training throughput and peak memory of every scheme on both
# kernels (sdpa, flex_attention) against absolute on its fastest kernel, then cached decoding. Sized for about 8
# minutes on one H100 / H200; each step has its own time limit, so a slow step costs its own figures only.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [COMMIT]
#
# LENGTHS (default "128 512 1024"), TRAINING_LIMIT (seconds per length, default 95), TESTS_LIMIT (seconds, default
# 170), KERNELS (default "sdpa flex_attention") and DECODING=0 (skip decoding) shorten it when less GPU time is left.
#
# Writes into OUT_DIR: environment.txt (commit, GPU, versions), cuda_tests.txt, training_n{128,512,1024}/ and
# decoding/ (each the benchmark's .md/.json/.png), and log.txt with everything printed. Run from the repository
# root with the package importable (PYTHONPATH=. or an install).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [COMMIT]}
commit=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

step() {  # step SECONDS NAME COMMAND...: run with a time limit, record how it ended
    local limit=$1 name=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@"
    local status=$?
    echo "== $name: exit $status after $((SECONDS - start)) s (limit $limit s)"
}

{
    echo "commit: $commit"
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
    "$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"

step "${TESTS_LIMIT:-170}" cuda-tests "$python" -m pytest -q -rs -p no:cacheprovider tests/test_kernels.py -k cuda \
    2>&1 | tee "$out/cuda_tests.txt"

for length in ${LENGTHS:-128 512 1024}; do
    step "${TRAINING_LIMIT:-95}" "training n=$length" "$python" -m benchmarks.bench_training --device cuda --dtype bfloat16 \
        --benchmarks model --shapes base --lengths "$length" --tokens 16384 --kernels ${KERNELS:-sdpa flex_attention} \
        --warmup 2 --repeats 5 --out "$out/training_n$length"
done

[ "${DECODING:-1}" = 1 ] && step 60 decoding "$python" -m benchmarks.bench_decoding --device cuda --dtype bfloat16 --repeats 2 \
    --out "$out/decoding"
