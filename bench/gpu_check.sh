#!/usr/bin/env bash
# The hook's CUDA check (#12), in one call on a machine with a CUDA GPU and torch (no server and
# no install needed: the hook imports torch alone). Usage, from the repository root:
#   bash bench/gpu_check.sh OUT_DIR
# 1. tests/client_hook/test_fused.py and test_devices.py on CUDA (AMPSCOPE_TEST_DEVICE=cuda): the
#    Triton kernel's statistics against the eager path and NumPy, and the hook's constants queued
#    without a host sync; the CPU-only fallback tests are left out.
# 2. bench/hook_sweep.py --device cuda at the CPU sweep's batch (4 x 32 tokens: launch-bound on a
#    GPU, so the step is the host's launches) and at 64 x 256 (a GPU-bound step); the hook's own
#    training-thread code runs under set_sync_debug_mode("error"), each sync counted.
# Each part has its own time limit, so one that hangs leaves the others their time.
set -u
out=${1:-.}
export PYTHONPATH="$PWD/client_hook:$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

echo "== 1. fused-kernel and device tests on CUDA"
# -W ignore: the project's filterwarnings=error would fail a background compile on a deprecation
# warning of this machine's torch; the statistics' assertions are unchanged.
AMPSCOPE_TEST_DEVICE=cuda timeout 120 python3 -m pytest --noconftest -p no:cacheprovider \
    -W ignore -q tests/client_hook/test_fused.py tests/client_hook/test_devices.py \
    -k "not TestFallback" >"$out/fused_cuda.log" 2>&1
echo "pytest exit $?"; tail -15 "$out/fused_cuda.log"

echo "== 2. sweep, batch 4 x 32"
timeout 240 python3 bench/hook_sweep.py --device cuda --sizes 0.25M,4M,10M --rounds 5 \
    --steps 20 2>"$out/sweep_small.err" | tee "$out/sweep_small.log"
echo "sweep exit ${PIPESTATUS[0]}"; grep -v " round " "$out/sweep_small.err" | tail -25

echo "== 3. sweep, batch 64 x 256"
timeout 150 python3 bench/hook_sweep.py --device cuda --sizes 4M,10M --rounds 5 --steps 20 \
    --batch 64 --tokens 256 2>"$out/sweep_big.err" | tee "$out/sweep_big.log"
echo "sweep exit ${PIPESTATUS[0]}"; grep -v " round " "$out/sweep_big.err" | tail -25
