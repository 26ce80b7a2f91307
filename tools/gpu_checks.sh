#!/usr/bin/env bash
# The checks a machine with a CUDA device runs, in one go (CI has no GPU):
#   1. build the native executor against that machine's PyTorch;
#   2. the CUDA tests (tests/d2s/test_cuda_*.py, tests/runtime/test_cuda_runtime.py and
#      test_program_device.py), and
#      the native executor's CPU tests against that build;
#   3. a differential fuzz run on the GPU (tools/fuzz_translator.py --device cuda);
#   4. the speed table on the GPU (benchmarks/speed.py --device cuda), with grad mode on and off.
# Each step's log goes to OUT; a summary is printed last.
#
#     bash tools/gpu_checks.sh OUT [FUZZ_COUNT] [WORKERS]
#
# It needs d2s's dependencies importable (gast and astor are often missing
# from GPU images: install them, or put their wheels' contents on PYTHONPATH)
# and pytest-xdist.
set -u
out=${1:-/tmp/d2s_gpu_checks}
fuzz_count=${2:-300}
workers=${3:-8}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export D2S_CACHE_DIR="${D2S_CACHE_DIR:-/tmp/d2s_gpu_cache}"
summary=()

step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep the log and the exit status
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    summary+=("$name: rc $rc in $((SECONDS - start)) s")
    return $rc
}

step env 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"'
step native 180 python3 -m runtime.native
step tests 240 python3 -m pytest -q -p no:cacheprovider -n "$workers" \
    tests/d2s/test_cuda_cases.py tests/d2s/test_cuda_graphs.py tests/runtime/test_cuda_runtime.py \
    tests/runtime/test_program_device.py
# The native executor's own tests (CPU), against the build for this machine's PyTorch; the
# version-error tests also one by one in this process, so that a crash shows its stack.
step native_versions 120 python3 -X faulthandler -m pytest -q -p no:cacheprovider tests/runtime/test_native.py \
    -k "in_place_changes or second_backward"
step native_cpu 200 python3 -m pytest -q -p no:cacheprovider -n "$workers" tests/runtime/test_native.py \
    tests/runtime/test_native_lstm_cell.py tests/runtime/test_native_gru_cell.py tests/runtime/test_native_flow.py
step fuzz 150 python3 tools/fuzz_translator.py --device cuda --count "$fuzz_count" --seed gpu --max-minutes 2 \
    --jobs "$workers" --no-minimize
step speed 240 env OMP_NUM_THREADS=1 python3 benchmarks/speed.py --device cuda --no-compile --rounds 7
step speed_no_grad 200 env OMP_NUM_THREADS=1 python3 benchmarks/speed.py --device cuda --no-compile --rounds 7 \
    --no-grad

for name in env native tests native_versions native_cpu fuzz speed speed_no_grad; do
    echo "== $name (last lines)"
    tail -n 14 "$out/$name.log" 2>/dev/null
done
printf '%s\n' "${summary[@]}"
