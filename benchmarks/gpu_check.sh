#!/usr/bin/env bash
# The prepared GPU check (issues #47, #48), ordered so that the main figure comes first and survives a time limit;
# every step writes its results as it goes (bench_training rewrites its .md/.json after each length). At most 8
# minutes (480 s of limits):
#   (a) smoke, 45 s: one attention layer, n = 512, flex_attention, absolute / shaw / xl / t5 (does it compile?)
#   (b) the main table, 150 s: base model, n = 512, every scheme on sdpa and flex_attention (and relpos_triton when
#       triton is installed), 1 warm-up + 3 timed rounds, peak memory; then at the recipes' attention dropout 0.1:
#       50 s, absolute and shaw on sdpa and relpos_triton (#48's setting, dropped probabilities); 40 s, absolute and
#       xl on sdpa (dropped probabilities) and flex_attention (key dropout, its fused form: #47 item 8)
#   (c) n = 1024, 70 s (LENGTHS="128 1024" adds n = 128)
#   (d) the CUDA tests, 60 s, then the relpos_triton kernel's bf16 and
#       determinism tests compiled for the GPU (not the interpreter; its float32 IEEE kernels compile for minutes), 40 s
#   (e) cached decoding, 25 s
# (a) and (b) alone are a result. TORCH_LOGS=recompiles goes to recompiles.txt; bench_training fails if FlexAttention
# compiles a graph during the timed rounds, and the kernel raises instead of falling back to the unfused path.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [COMMIT]
#
# KERNELS (default "sdpa flex_attention" + relpos_triton when triton is installed), LENGTHS (for (c), default
# "1024"), DECODING=0 (skip (e)) and TESTS=0 (skip (d)) shorten it. Writes into OUT_DIR: environment.txt, smoke/,
# training_n512/, training_n512_dropout0.1/, training_n512_key_dropout0.1/, training_n1024/ (and training_n128/ when asked), cuda_tests.txt,
# triton_tests.txt, decoding/, recompiles.txt and log.txt. Run from the repository root with the package importable
# (PYTHONPATH=. or an install).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [COMMIT]}
commit=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TORCH_LOGS=recompiles
python=${PYTHON:-python3}

step() {  # step SECONDS NAME COMMAND...: run with a time limit (recompile logs to recompiles.txt), record the end
    local limit=$1 name=$2
    shift 2
    local start=$SECONDS
    echo "== $name" >> "$out/recompiles.txt"
    timeout "$limit" "$@" 2> >(tee -a "$out/recompiles.txt" >&2)
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

triton=$("$python" -c "import importlib.util; \
print('relpos_triton' if importlib.util.find_spec('triton') else '')" 2>/dev/null)
kernels=${KERNELS:-sdpa flex_attention $triton}
training() {  # training SECONDS NAME ARGS...
    local limit=$1 name=$2
    shift 2
    step "$limit" "$name" "$python" -m benchmarks.bench_training --device cuda --dtype bfloat16 --shapes base \
        --tokens 16384 --warmup 1 --repeats 3 "$@"
}

training 45 "(a) smoke: one layer n=512 flex" --benchmarks attention --lengths 512 --kernels flex_attention \
    --schemes absolute shaw xl t5 --repeats 1 --out "$out/smoke"
training 150 "(b) main table: base model n=512" --benchmarks model --lengths 512 --kernels $kernels \
    --out "$out/training_n512"
training 50 "(b) attention dropout 0.1: base model n=512, absolute and shaw" --benchmarks model --lengths 512 \
    --kernels sdpa $triton --schemes absolute shaw --attention_dropout 0.1 --out "$out/training_n512_dropout0.1"
training 40 "(b) attention dropout 0.1, key dropout on flex: base model n=512, absolute and xl" --benchmarks model \
    --lengths 512 --kernels sdpa flex_attention --schemes absolute xl --attention_dropout 0.1 \
    --out "$out/training_n512_key_dropout0.1"
for length in ${LENGTHS:-1024}; do
    training 70 "(c) base model n=$length" --benchmarks model --lengths "$length" --kernels $kernels \
        --out "$out/training_n$length"
done
[ "${TESTS:-1}" = 1 ] && step 60 "(d) CUDA tests" "$python" -m pytest -q -rs -p no:cacheprovider tests/test_kernels.py \
    -k cuda 2>&1 | tee "$out/cuda_tests.txt"
[ "${TESTS:-1}" = 1 ] && [ -n "$triton" ] && step 40 "(d) relpos_triton tests on the GPU" "$python" -m pytest -q -rs \
    -p no:cacheprovider tests/test_triton_shaw.py -k "bfloat16 or deterministic" 2>&1 | tee "$out/triton_tests.txt"
[ "${DECODING:-1}" = 1 ] && step 25 "(e) cached decoding" "$python" -m benchmarks.bench_decoding --device cuda \
    --dtype bfloat16 --repeats 2 --out "$out/decoding"
