#!/usr/bin/env bash
# The hook's CUDA check (#12), in one call on a machine with a CUDA GPU and torch (no server and
# no install needed: the hook imports torch alone). Usage, from the repository root:
#   bash bench/gpu_check.sh OUT_DIR [tests,profile,sweep]
# tests:   tests/client_hook/test_fused.py and test_devices.py on CUDA (AMPSCOPE_TEST_DEVICE=cuda):
#          the Triton kernel's statistics against the eager path and NumPy, and the hook's
#          constants queued without a host sync; the CPU-only fallback tests are left out.
# profile: bench/profile_hook.py --device cuda at 4M: the hook's own time per wrapped scaler
#          call, the sender thread's per record, the ops and the kernels it adds per step, and a
#          cProfile of the training thread (PROFILE=cprofile,... picks the views).
# sweep:   bench/hook_sweep.py --device cuda at the CPU sweep's batch (4 x 32 tokens: launch-bound
#          on a GPU, so the step is the host's launches) and at 64 x 256 (a GPU-bound step); the
#          hook's training-thread code runs under set_sync_debug_mode("error"), syncs counted.
# Each part has its own time limit, so one that hangs leaves the others their time.
set -u
out=${1:-.}
parts=${2:-tests,profile,sweep}
export PYTHONPATH="$PWD/client_hook:$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

if [[ ,$parts, == *,tests,* ]]; then
  echo "== fused-kernel and device tests on CUDA"
  # -W ignore: the project's filterwarnings=error would fail a background compile on a
  # deprecation warning of this machine's torch; the statistics' assertions are unchanged.
  AMPSCOPE_TEST_DEVICE=cuda timeout 120 python3 -m pytest --noconftest -p no:cacheprovider \
      -W ignore -q tests/client_hook/test_fused.py tests/client_hook/test_devices.py \
      -k "not TestFallback" >"$out/fused_cuda.log" 2>&1
  echo "pytest exit $?"; tail -15 "$out/fused_cuda.log"
fi

if [[ ,$parts, == *,profile,* ]]; then
  echo "== where the hook's time goes on CUDA (4M, batch 4 x 32)"
  (cd bench && timeout 120 python3 profile_hook.py --device cuda --size 4M --steps 60 \
      --only "${PROFILE:-inloop,sender,launches,kernels,cprofile}") 2>"$out/profile.err" \
      | tee "$out/profile.log"
  echo "profile exit ${PIPESTATUS[0]}"; tail -5 "$out/profile.err"
fi

if [[ ,$parts, == *,sweep,* ]]; then
  echo "== sweep, batch 4 x 32"
  timeout 200 python3 bench/hook_sweep.py --device cuda --sizes 0.25M,4M,10M --rounds 5 \
      --steps 20 2>"$out/sweep_small.err" | tee "$out/sweep_small.log"
  echo "sweep exit ${PIPESTATUS[0]}"; grep -v " round " "$out/sweep_small.err" | tail -25

  echo "== sweep, batch 64 x 256"
  timeout 150 python3 bench/hook_sweep.py --device cuda --sizes 4M,10M --rounds 5 --steps 20 \
      --batch 64 --tokens 256 2>"$out/sweep_big.err" | tee "$out/sweep_big.log"
  echo "sweep exit ${PIPESTATUS[0]}"; grep -v " round " "$out/sweep_big.err" | tail -25
fi
