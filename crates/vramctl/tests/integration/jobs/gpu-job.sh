#!/usr/bin/env bash
# A stand-in for a training job, for `vramctl run` and `vramctl fit` tests on the fake NVML:
# it "holds" GPU memory by announcing it in $FAKE_NVML_PROCESS_DIR/<its pid> (lines
# `GPU_INDEX BYTES`, docs/scenarios.md "Processes from a directory"), and the memory is a
# formula of one value (the batch size a real job would take).
#
#   gpu-job.sh [VALUE]        VALUE: else $VRAMCTL_FIT_VALUE, else 1
#
# Memory in MiB for the value v:
#   JOB_BASE_MIB + JOB_PER_VALUE_MIB * v + (JOB_QUAD_MILLI_MIB * v * v) / 1000
#   (defaults 512, 100, 0), plus, when JOB_NOISE_PCT > 0, noise uniform in +-pct %,
#   the same for the same (v, JOB_SEED) (bash's RANDOM seeded with both).
# JOB_STEPS steps (default 2) of JOB_STEP_S seconds (default 0.2). Step 1 holds
# JOB_FIRST_STEP_PCT % of the memory (default 100), later steps all of it. Before each step,
# a step over JOB_LIMIT_MIB (unset: no limit) prints a PyTorch out-of-memory error on stderr
# and exits 1; otherwise the step's memory is written (write .tmp, then mv) for GPU JOB_GPU
# (default 0), `step N done` goes to stdout, and the step sleeps. Then `done`, exit JOB_EXIT
# (default 0). The file is removed at exit, whatever the exit.
#
# JOB_MODE: train (default: the above) | fail (after step 1: a ValueError on stderr, exit 3)
#   | forever (steps never end) | child (a child bash runs this script in train mode and
#   holds the memory under its own pid; the parent holds none, forwards TERM/INT/HUP to it,
#   and exits with its status) | signals (train, with TERM INT HUP USR1 USR2 trapped: prints
#   `job got SIGTERM` etc. on stdout, exits 128 + the signal's number; the traps are set
#   before step 1, so a test that has read `step 1 done` may signal).
# JOB_ECHO_STDIN=1: copy stdin to stdout before the steps.
#
# Bash and coreutils only.

set -u

die_usage() {
    echo "gpu-job.sh: $1" >&2
    exit 2
}

# Sets variable $1 to the integer in environment variable $2, or $3 when that is unset or
# empty; anything else is a usage error.
int_var() {
    local text=${!2:-$3}
    [[ $text =~ ^[0-9]+$ ]] || die_usage "$2='$text' is not a non-negative integer"
    printf -v "$1" '%d' $((10#$text))
}

value=${1:-${VRAMCTL_FIT_VALUE:-1}}
[[ $value =~ ^[0-9]+$ ]] || die_usage "the value '$value' is not a non-negative integer"
value=$((10#$value))
mode=${JOB_MODE:-train}
int_var base_mib JOB_BASE_MIB 512
int_var per_value_mib JOB_PER_VALUE_MIB 100
int_var quad_milli_mib JOB_QUAD_MILLI_MIB 0
int_var noise_pct JOB_NOISE_PCT 0
int_var seed JOB_SEED 0
int_var steps JOB_STEPS 2
int_var first_step_pct JOB_FIRST_STEP_PCT 100
int_var gpu JOB_GPU 0
int_var job_exit JOB_EXIT 0
step_s=${JOB_STEP_S:-0.2}
[[ $step_s =~ ^[0-9]+(\.[0-9]+)?$ ]] || die_usage "JOB_STEP_S='$step_s' is not a number of seconds"
limit_mib=""
if [[ -n ${JOB_LIMIT_MIB:-} ]]; then
    int_var limit_mib JOB_LIMIT_MIB 0
fi
dir=${FAKE_NVML_PROCESS_DIR:-}

case $mode in
    train | fail | forever | child | signals) ;;
    *) die_usage "JOB_MODE='$mode' is not one of train, fail, forever, child, signals" ;;
esac

if [[ $mode == child ]]; then
    JOB_MODE=train bash "${BASH_SOURCE[0]}" "$value" <&0 &
    child=$!
    for sig in TERM INT HUP; do
        # shellcheck disable=SC2064 # the child's pid is fixed now
        trap "kill -$sig $child 2>/dev/null" "$sig"
    done
    # `wait` returns early when a trapped signal arrives; wait again until the child is gone.
    while true; do
        wait "$child"
        status=$?
        kill -0 "$child" 2>/dev/null || exit "$status"
    done
fi

mib=$((base_mib + per_value_mib * value + (quad_milli_mib * value * value) / 1000))
if ((noise_pct > 0)); then
    RANDOM=$((seed * 1000003 + value))
    draw=$RANDOM # 0 .. 32767
    # mib * pct/100 * (2 * draw / 32767 - 1), in integers.
    mib=$((mib + mib * noise_pct * (2 * draw - 32767) / (100 * 32767)))
fi
mib_bytes=1048576

# "1.50 GiB" for a number of MiB.
gib_text() {
    local mib=$1
    printf '%d.%02d GiB' $((mib / 1024)) $((mib % 1024 * 100 / 1024))
}

file=""
if [[ -n $dir ]]; then
    file="$dir/$$"
    trap 'rm -f "$file" "$file.tmp"' EXIT
fi

if [[ $mode == signals ]]; then
    for sig in TERM INT HUP USR1 USR2; do
        num=$(kill -l "$sig")
        # shellcheck disable=SC2064 # the signal's name and number are fixed now
        trap "echo 'job got SIG$sig'; exit $((128 + num))" "$sig"
    done
fi

if [[ ${JOB_ECHO_STDIN:-0} == 1 ]]; then
    cat
fi

held_mib=0
step=0
while [[ $mode == forever ]] || ((step < steps)); do
    step=$((step + 1))
    if ((step == 1)); then
        step_mib=$((mib * first_step_pct / 100))
    else
        step_mib=$mib
    fi
    if [[ -n $limit_mib ]] && ((step_mib > limit_mib)); then
        free_mib=$((limit_mib > held_mib ? limit_mib - held_mib : 0))
        {
            echo "Traceback (most recent call last):"
            echo "  File \"train.py\", line 42, in <module>"
            echo "    loss = model(batch).loss"
            echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate $(gib_text $((step_mib - held_mib))). GPU $gpu has a total capacity of $(gib_text "$limit_mib") of which ${free_mib}.00 MiB is free."
        } >&2
        exit 1
    fi
    if [[ -n $file ]]; then
        echo "$gpu $((step_mib * mib_bytes))" >"$file.tmp" && mv -f "$file.tmp" "$file"
    fi
    held_mib=$step_mib
    echo "step $step done"
    if [[ $mode == fail ]]; then
        echo "ValueError: unknown optimizer 'adamw2'" >&2
        exit 3
    fi
    # In the background, so a trapped signal runs its trap at once instead of after sleep.
    sleep "$step_s" &
    wait $!
done
echo "done"
exit "$job_exit"
