#!/usr/bin/env bash
# The prepared GPU check of the fused kernels (flex_attention, relpos_triton), ordered so that the main figure comes
# first and survives a time limit.
# Every step is its own process that writes its record when it ends (bench_training: after each length), sized from
# the calls measured on an H200 (docs/results/gpu_check/2026-11-27_h200_cae802d): a process starts in ~15 s,
# relpos_triton's first call (compiles + autotuning of its encoder and decoder flag sets) takes ~95-120 s (a new
# power-of-two length bucket autotunes again, without compiling),
# FlexAttention's ~5-17 s per scheme in the base model without dropout and ~190 s with key dropout, sdpa's < 5 s.
# At most 8 minutes (480 s of limits; the steps took 276 s at a0f821f, docs/results/gpu_check/2026-12-04_h200_a0f821f,
# and 264 s at d34293a, before (v) was added):
#   (a) 205 s: the setting of relpos_triton's goals (at n = 512, shaw at least 0.85 x absolute's tokens/s and at most
#       a tenth more peak memory): base model, attention dropout 0.1 (dropped probabilities), absolute and shaw on sdpa
#       and relpos_triton (when triton is installed, else sdpa alone), n = 512, then 128, then 1024 (132-161 s in all)
#   (t) 40 s: where the full model's step time goes at n = 512, absolute on sdpa and shaw on relpos_triton
#       (benchmarks.step_timeline: drained and consecutive ms per step, host enqueue time, synchronizations, device
#       time per kernel, the host's Python functions; 2026-11-28 at 8ed37f1: shaw's step was host-bound, twice as
#       long as absolute's where its device time is an estimated 7 ms more: six times the one-layer model's 1.17 ms)
#   (u) 40 s: the host's own work per step, Triton's launch path included: the same series at n = 16 (batch 32),
#       where the device's work is small beside the host's (benchmarks.host_overhead measures the host's part on a
#       CPU with Triton's launches stubbed out; 2026-12-04 at a0f821f the n = 512 step's host enqueue was 101 ms for
#       shaw against 57 ms for absolute, where the CPU measurement gives 3.3-3.7 ms more)
#   (v) 50 s: where that extra host work goes (benchmarks.host_split, n = 16, batch 32): each series' step and forward
#       with relpos_triton's launches real or no-ops, and the backward on autograd's device thread or the caller's,
#       with the garbage collector's time within each row's steps
#       (2026-12-04 at d34293a: 23.8 ms more a step for shaw at n = 16, the CPU measurement 5-7 ms: the rest is what
#       only a GPU run does, the launches' driver calls or the device thread's hand-offs among the candidates)
#   (c) 25 s: where shaw's extra time goes on relpos_triton: every CUDA kernel's device time in one training step of a
#       one-layer encoder-decoder, absolute on sdpa and shaw on relpos_triton, attention dropout 0.1 as in (a),
#       n = 512, with the package's blocks timed per kernel by the autotuner (benchmarks.tune_relpos_triton
#       --candidates package; the kernels compiled by (a) are cached; 2026-11-28: the operator-level profile missed
#       the Triton forward); without triton, the operator profile of one self-attention layer on sdpa
#   (d) 30 + 90 s: the CUDA tests of sdpa against eager (the flex_attention ones, 9 of which passed in 140 s on
#       the H200, are FLEX_TESTS=1), then relpos_triton's kernels compiled for the GPU against the float64 oracle on
#       bf16 inputs, dT stored in bf16 rounded to nearest even (CPU tests run Triton's interpreter, which truncates),
#       and that a key the device's triton has tuned launches directly (its autotuner forms the key the
#       package forms: else every launch would take the autotuner's path again), when triton is installed
#   beyond the 8 minutes: KEY_DROPOUT=1 adds (f) 420 s: attention dropout 0.1 on the fused path, absolute and xl on sdpa
#       (probabilities) and flex_attention (key dropout, its fused form); FLEX=1 adds (b) 2 x 90 s: the
#       fused path at attention dropout 0, base model, n = 512, on sdpa and flex_attention: absolute / xl / t5, then
#       absolute / shaw / alibi (two processes, so that one slow compile does not lose the other half; measured at
#       3c5d2ac); TRITON_TESTS=1 adds 300 s: relpos_triton's bf16 and determinism tests compiled for the GPU (one
#       passed in 90 s); DECODING=1 adds 150 + 120 s: cached decoding (every scheme, cached and uncached, written at
#       the end: on the H200 at a0f821f it printed nothing within 50 s), then on the static cache (absolute and shaw; generate
#       compiles the decoding step, not measured yet); PRECISION=1 adds 200 s: shaw's bf16 training on
#       relpos_triton for 300 steps against float32 eager (new flag sets, so relpos_triton compiles
#       again; the record rewritten after each of its three runs); ABLATE=1 adds 150 s: relpos_triton's op with its
#       a^K bias, a^V masses and dropout switched off one at a time beside sdpa on the same inputs, n = 512, at the
#       blocks the H200 chose (18 compiles); FLEX_TESTS=1 adds 300 s: flex_attention's CUDA tests; COMPILE=1 adds
#       (h) 420 s: (a) at n = 512 with every model through torch.compile (inductor), as the Trainer's torch_compile
#       runs it (four compiles of the base model, and relpos_triton's autotuning again), two warm-up rounds: a second
#       compiled model in one process recompiles frames the first compiled (2026-12-04 at a0f821f, with relpos_triton
#       alone: first calls 43 s for absolute and 209 s for shaw, then 2 graphs compiled in the timed rounds after one
#       warm-up round; a process that compiles one model, as the Trainer's, compiles nothing after its first step)
# (a) alone is a result. TORCH_LOGS=recompiles goes to recompiles.txt; bench_training fails if FlexAttention compiles a
# graph during the timed rounds, and the kernel raises instead of falling back to the unfused path.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [COMMIT]
#
# KERNELS (the fused kernels of (b), default "flex_attention") and TESTS=0 (skip (d)) change it. Writes into OUT_DIR:
# environment.txt (GPU, torch, transformers, triton and the training stack's versions), training_dropout0.1/, timeline_n512/, timeline_n16/, host_split_n16/, tuning_n512/ (profile_dropout0.1/ without triton), cuda_tests.txt,
# triton_cuda_tests.txt, (flex_cuda_tests.txt, training_n512_key_dropout0.1/, training_n512_flex_xl_t5/, training_n512_flex_shaw_alibi/, ablation_n512/,
# triton_tests.txt, precision/, decoding/, decoding_static/, training_compiled_n512/,) recompiles.txt and log.txt. Run from the repository root with the
# package importable (PYTHONPATH=. or an install).
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
    # one process (each start imports torch: seconds of the lease)
    "$python" -c "import importlib, importlib.util, torch, transformers
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)
for name in ('triton', 'accelerate', 'datasets', 'numpy', 'pyarrow', 'tokenizers', 'huggingface_hub'):
    print(name, importlib.import_module(name).__version__ if importlib.util.find_spec(name) else 'not installed')"
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"

triton=$("$python" -c "import importlib.util; \
print('relpos_triton' if importlib.util.find_spec('triton') else '')" 2>/dev/null)
training() {  # training SECONDS NAME ARGS...
    local limit=$1 name=$2
    shift 2
    step "$limit" "$name" "$python" -m benchmarks.bench_training --device cuda --dtype bfloat16 --shapes base \
        --tokens 16384 --warmup 1 --repeats 3 --benchmarks model "$@"
}

training 205 "(a) attention dropout 0.1: base model, absolute and shaw, n=512 128 1024" --lengths 512 128 1024 \
    --kernels sdpa $triton --schemes absolute shaw --attention_dropout 0.1 --out "$out/training_dropout0.1"
step 40 "(t) where the step's time goes: base model, absolute and shaw, n=512" "$python" -m benchmarks.step_timeline \
    --device cuda --dtype bfloat16 --shape base --length 512 --tokens 16384 --attention_dropout 0.1 --steps 5 \
    --series absolute@sdpa "shaw@${triton:-sdpa}" --host_profile --out "$out/timeline_n512"
step 40 "(u) the host's work per step: base model, absolute and shaw, n=16" "$python" -m benchmarks.step_timeline \
    --device cuda --dtype bfloat16 --shape base --length 16 --tokens 512 --attention_dropout 0.1 --steps 10 \
    --series absolute@sdpa "shaw@${triton:-sdpa}" --out "$out/timeline_n16"
step 50 "(v) where the extra host work goes: launches real or none, backward thread, n=16" "$python" -m \
    benchmarks.host_split --device cuda --dtype bfloat16 --shape base --length 16 --batch 32 --attention_dropout 0.1 \
    --rounds 5 --series absolute@sdpa "shaw@${triton:-sdpa}" --out "$out/host_split_n16"
if [ -n "$triton" ]; then
    step 25 "(c) every CUDA kernel's time: one-layer model, absolute and shaw, n=512" "$python" -m \
        benchmarks.tune_relpos_triton --device cuda --dtype bfloat16 --shape base --length 512 --tokens 16384 \
        --attention_dropout 0.1 --candidates package --out "$out/tuning_n512"
else
    step 35 "(c) profile: one self-attention layer, absolute and shaw, n=512 128" "$python" -m \
        benchmarks.profile_attention --device cuda --dtype bfloat16 --shape base --tokens 16384 --lengths 512 128 \
        --kernel sdpa --schemes absolute shaw --attention_dropout 0.1 --out "$out/profile_dropout0.1"
fi
if [ "${TESTS:-1}" = 1 ]; then
    step 30 "(d) CUDA tests: sdpa against eager, Shaw's masses and gathered a^K gradients in float32" "$python" -m pytest -q -rs -p no:cacheprovider \
        tests/test_positions.py tests/test_kernels.py -k "cuda and not flex" 2>&1 | tee "$out/cuda_tests.txt"
    [ -n "$triton" ] && step 90 "(d) relpos_triton compiled for the GPU against the oracle, bf16; dT stored rounded to nearest; the tuned blocks' direct launch" \
        "$python" -m pytest -q -rs -p no:cacheprovider tests/test_triton_shaw.py -k "bfloat16_within or rounded_once or tuned_key or pinned_blocks" \
        2>&1 | tee "$out/triton_cuda_tests.txt"
fi
if [ "${KEY_DROPOUT:-0}" = 1 ]; then
    training 420 "(f) attention dropout 0.1, key dropout on flex: base model n=512, absolute and xl" --lengths 512 \
        --kernels sdpa flex_attention --schemes absolute xl --attention_dropout 0.1 \
        --out "$out/training_n512_key_dropout0.1"
fi
if [ "${FLEX:-0}" = 1 ]; then
    training 90 "(b) fused path: base model n=512, absolute xl t5" --lengths 512 \
        --kernels sdpa ${KERNELS:-flex_attention} --schemes absolute xl t5 --out "$out/training_n512_flex_xl_t5"
    training 90 "(b) fused path: base model n=512, absolute shaw alibi" --lengths 512 \
        --kernels sdpa ${KERNELS:-flex_attention} --schemes absolute shaw alibi --out "$out/training_n512_flex_shaw_alibi"
fi
if [ "${ABLATE:-0}" = 1 ] && [ -n "$triton" ]; then
    step 150 "(g) what each term of relpos_triton costs, beside sdpa: n=512" "$python" -m \
        benchmarks.ablate_relpos_triton --length 512 --tokens 16384 --attention_dropout 0.1 --out "$out/ablation_n512"
fi
if [ "${TRITON_TESTS:-0}" = 1 ] && [ -n "$triton" ]; then
    step 300 "(d) relpos_triton tests on the GPU" "$python" -m pytest -q -rs -p no:cacheprovider \
        tests/test_triton_shaw.py -k "bfloat16 or deterministic" 2>&1 | tee "$out/triton_tests.txt"
fi
if [ "${PRECISION:-0}" = 1 ] && [ -n "$triton" ]; then
    step 200 "(e) bf16 training on relpos_triton against float32 eager" "$python" -m benchmarks.bench_precision \
        --device cuda --kernel relpos_triton --scheme shaw --steps 300 --out "$out/precision"
fi
if [ "${DECODING:-0}" = 1 ]; then
    step 150 "(e) cached decoding" "$python" -m benchmarks.bench_decoding --device cuda --dtype bfloat16 --repeats 2 \
        --out "$out/decoding"
    step 120 "(e) cached decoding on the static cache (generate compiles the step)" "$python" -m \
        benchmarks.bench_decoding --device cuda --dtype bfloat16 --repeats 2 --cache-implementation static \
        --schemes absolute shaw --out "$out/decoding_static"
fi
if [ "${COMPILE:-0}" = 1 ]; then
    training 420 "(h) torch.compile'd models: base model, absolute and shaw, n=512" --lengths 512 --kernels sdpa \
        $triton --schemes absolute shaw --attention_dropout 0.1 --compile --warmup 2 --out "$out/training_compiled_n512"
fi
if [ "${FLEX_TESTS:-0}" = 1 ]; then
    step 300 "(d) CUDA tests: flex_attention against eager" "$python" -m pytest -q -rs -p no:cacheprovider \
        tests/test_kernels.py -k "cuda and flex" 2>&1 | tee "$out/flex_cuda_tests.txt"
fi
