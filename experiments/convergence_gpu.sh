#!/usr/bin/env bash
# experiments/convergence.py on one GPU within one device call: every (system, seed) trains as its own process,
# PARALLEL of them at a time (default 6: a d_model-256 model leaves an H100 mostly idle), seed by seed, none started
# later than 30 s before LIMIT_SECONDS (default 480) and each stopped at it; then the finished runs' records are
# packed for collecting elsewhere.
#
#   bash experiments/convergence_gpu.sh DATA WORK OUT "SYSTEMS" "SEEDS" [LIMIT_SECONDS] [-- convergence.py options]
#
# e.g. (the peer trained as the recipes are, three seeds of every row)
#   bash experiments/convergence_gpu.sh .data/multi30k /tmp/convergence "$OUT" \
#       "peer+recipe-training absolute shaw xl directional rope" "1 2 3" 480
# or (every recipe and the peer trained as they are, to one stopping rule on validation BLEU: an evaluation per
# epoch, stopped after 3 without a gain of more than 0.1, the last 5 averaged; report test2016 only, since
# validation chose the stopping point)
#   bash experiments/convergence_gpu.sh .data/multi30k /tmp/stopping "$OUT" \
#       "peer+recipe-training absolute shaw xl directional rope" "1 2 3" 480 -- --epochs 100 --recipe-flags \
#       --validation_file .data/multi30k/validation.jsonl --eval_strategy epoch --early_stopping_patience 3 \
#       --early_stopping_threshold 0.1
#
# or (the decoder start token swapped into absolute, the one structural difference left between it and the peer, beside
# a third seed of every other row), sized to the one call a lease has left after the check: a 20-epoch run took about
# 8.5 minutes with twelve at once on an H100, so eleven runs at once, two invocations side by side (every whole run
# counts; a second call would finish the rest):
#   PARALLEL=5 bash experiments/convergence_gpu.sh .data/multi30k /tmp/seed3 "$OUT/seed3" \
#       "peer+recipe-training shaw xl directional rope" "3" 540 &
#   PARALLEL=6 bash experiments/convergence_gpu.sh .data/multi30k /tmp/swap "$OUT/swap" \
#       "absolute absolute+pad-start" "1 2 3" 540; wait
#
# or (joined-pair training for the recipes' 20 epochs, the criterion in docs/results.md 5b; each finished run's averaged
# weights then scored by experiments/long_inputs.py as the recipes decode, against shaw of the same seed; a joined-pair
# run has about twice as many steps as shaw's, up to 4 pairs per join 2.5 times, so a second call in the same lease
# finishes what the first one's limit cut off):
#   LONG_INPUTS="--length-penalty 1.0" PARALLEL=9 bash experiments/convergence_gpu.sh \
#       .data/multi30k /tmp/joined "$OUT/joined" "shaw shaw+concat-0.5 shaw+concat-0.5-up-to-4" "1 2 3" 540
#
# LONG_INPUTS="OPTIONS" (long_inputs.py's decoding options): when every asked-for run has finished before the limit,
# each one's averaged weights are scored in its own process (PARALLEL at a time, every process stopped at the limit),
# then collected into OUT/long_inputs.{json,md} with every system tested against the first of SYSTEMS of the same
# seed (--baseline); each model's kept scores and translations go into runs.tgz.
#
# A run whose <WORK>/<system>/seed<S>/run.json exists is not trained again, and one that a time limit cut off
# continues from its newest complete checkpoint (an epoch's), so a second call in the same lease finishes what a
# first one's time limit cut off. Writes into OUT: runs.tgz (every finished run.json, and the averaged weights' hypotheses
# that the paired tests against the baseline read; paths relative to WORK), logs.tgz (one log per process),
# convergence.md/json when every asked-for run has finished, and status.txt (which finished).
# Collect elsewhere with: tar xzf runs.tgz -C WORK && python experiments/convergence.py --work WORK --collect-only ...
set -uo pipefail
data=${1:?usage: convergence_gpu.sh DATA WORK OUT SYSTEMS SEEDS [LIMIT_SECONDS] [-- options]}
work=${2:?WORK}
out=${3:?OUT}
systems=${4:?SYSTEMS}
seeds=${5:?SEEDS}
limit=${6:-480}
shift $(( $# < 6 ? $# : 6 ))
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-python3}
parallel=${PARALLEL:-6}
# Every argument checked before anything trains: a misspelt system, a seed that is no number, a bad convergence.py
# option or a bad LONG_INPUTS option would otherwise fail only in its own process (or after every run has trained)
# while the other runs spend the lease.
if ! [[ $limit =~ ^[0-9]+$ ]]; then
    echo "convergence_gpu.sh: LIMIT_SECONDS must be a whole number of seconds, got '$limit'" >&2; exit 2
fi
if ! [[ $parallel =~ ^[1-9][0-9]*$ ]]; then
    echo "convergence_gpu.sh: PARALLEL must be a positive whole number, got '$parallel'" >&2; exit 2
fi
# shellcheck disable=SC2086
convergence_arguments=(--data "$data" --work "$work" --out "$out" --systems $systems --seeds $seeds "$@")
long_inputs_arguments=()
if [ -n "${LONG_INPUTS:-}" ]; then
    read -r first_system _ <<< "$systems"
    read -r first_seed _ <<< "$seeds"
    # shellcheck disable=SC2086
    long_inputs_arguments=(--data "$data" --out "$out/long_inputs" --baseline "$first_system"
        --model "$first_system:$first_seed=$work/$first_system/seed$first_seed/averaged" $LONG_INPUTS)
fi
# One process checks both scripts' arguments and names the device (each start imports torch and transformers: seconds
# of the lease); a --help goes to stderr, and then nothing runs.
device=$("$python" -c '
import contextlib, sys
sys.path.insert(0, "experiments")
import convergence, long_inputs, torch
split = 2 + int(sys.argv[1])
with contextlib.redirect_stdout(sys.stderr):
    convergence.parse_command_line(sys.argv[2:split])
    if len(sys.argv) > split:
        long_inputs.parse_command_line(sys.argv[split:])
print("cuda" if torch.cuda.is_available() else "cpu")' \
    "${#convergence_arguments[@]}" "${convergence_arguments[@]}" "${long_inputs_arguments[@]}") || exit 2
[ -n "$device" ] || exit 0
deadline=$((SECONDS + limit))
mkdir -p "$work/logs" "$out"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

for seed in $seeds; do
    for system in $systems; do
        [ -f "$work/$system/seed$seed/run.json" ] && continue
        while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n; done
        [ $((deadline - SECONDS)) -le 30 ] && break 2
        timeout $((deadline - SECONDS)) "$python" experiments/convergence.py --data "$data" --work "$work" \
            --out "$work/tables/$system-$seed" --systems "$system" --seeds "$seed" --threads 1 "$@" \
            > "$work/logs/$system-$seed.log" 2>&1 &
    done
done
wait

for system in $systems; do
    for seed in $seeds; do
        if [ -f "$work/$system/seed$seed/run.json" ]; then echo "finished: $system seed $seed"
        else echo "missing: $system seed $seed"; fi
    done
done | tee "$out/status.txt"
if [ -n "${LONG_INPUTS:-}" ] && ! grep -q '^missing' "$out/status.txt"; then
    models=()
    for seed in $seeds; do
        for system in $systems; do
            models+=(--model "$system:$seed=$work/$system/seed$seed/averaged")
            while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n; done
            left=$((deadline - SECONDS))
            [ "$left" -le 30 ] && break 2
            # shellcheck disable=SC2086
            timeout "$left" "$python" experiments/long_inputs.py --data "$data" \
                --out "$work/long_inputs/$system-$seed" --model "$system:$seed=$work/$system/seed$seed/averaged" \
                --device "$device" $LONG_INPUTS > "$work/logs/long_inputs-$system-$seed.log" 2>&1 &
        done
    done
    wait
    read -r baseline _ <<< "$systems"
    left=$((deadline - SECONDS))
    if [ "$left" -gt 30 ]; then
        # shellcheck disable=SC2086
        timeout "$left" "$python" experiments/long_inputs.py --data "$data" --out "$out/long_inputs" "${models[@]}" \
            --device "$device" --baseline "$baseline" $LONG_INPUTS > "$work/logs/long_inputs.log" 2>&1
        echo "long_inputs: exit status $?" | tee -a "$out/status.txt"
    else
        echo "long_inputs: not collected, the limit was reached" | tee -a "$out/status.txt"
    fi
fi
(cd "$work" && find . \( -name run.json -o -path "*/averaged_hypotheses/*_hypotheses.txt" \
    -o -path "*/averaged/long_inputs_scores.json" \) -print0 | tar czf "$out/runs.tgz" --null -T -)
tar czf "$out/logs.tgz" -C "$work" logs
if ! grep -q '^missing' "$out/status.txt"; then
    # shellcheck disable=SC2086
    "$python" experiments/convergence.py --data "$data" --work "$work" --out "$out" --systems $systems --seeds $seeds \
        --collect-only "$@"
fi
