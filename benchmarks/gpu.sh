#!/usr/bin/env bash
# Benchmarks on a GPU machine, each bounded in time, each log in $OUT (or /tmp/gpu-bench).
# Run from the repository root on a machine whose python3 has JAX with CUDA (and Flax, optax for "budget"):
#   bash benchmarks/gpu.sh           the loop benchmarks
#   bash benchmarks/gpu.sh budget    issue 30's byte budgets: the transformer at issue 30's size, both
#                                    orders, the ResNet and the largest batches, then the planner's quick set
#   bash benchmarks/gpu.sh regret    issue 37 on a GPU: regret.py --quick (the planner against the measured
#                                    oracle), loops, training_memory, the demo (under 10 minutes)
OUT=${OUT:-/tmp/gpu-bench}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
run() { local name=$1 limit=$2; shift 2
  echo "== $name ($*)"; timeout "$limit" "$PY" "$@" > "$OUT/$name.txt" 2>&1; echo "   rc $? after ${SECONDS}s"; tail -3 "$OUT/$name.txt"; }
nvidia-smi -L; $PY -c "import jax, jaxform; print(jax.__version__, jax.devices())" || exit 1
if [ "${1:-loops}" = regret ]; then
  # (one H200, 2026-11-27: regret --quick ~30 s a program, 22 rows in 290 s; loops 25 s; training_memory and
  # the demo ran past 60 s and 95 s)
  # (2026-11-28: loops.py left out, its passes unplanned; regret given what it took, the rest kept under 570 s)
  run regret_quick 340 benchmarks/regret.py --quick --json "$OUT/regret_quick.json"
  run demo 120 -m jaxform.cli demo
  run training_memory 90 benchmarks/training_memory.py --quick
  exit
fi
if [ "${1:-loops}" = budget ]; then
  run budget_big 240 benchmarks/memory_budget.py --big --quick
  run budget_grad_first 120 benchmarks/memory_budget.py --grad-first --quick
  run budget_resnet_batch 100 benchmarks/memory_budget.py --resnet --quick
  run planner 60 benchmarks/planner.py --quick --no-transformer
  exit
fi
run calibrate 60 benchmarks/calibrate.py
run loops 130 benchmarks/loops.py --quick
run scan_reductions 80 benchmarks/scan_reductions.py --quick
run stream_rows 60 benchmarks/stream_rows.py --reps 7
run planner 90 benchmarks/planner.py --quick --no-transformer
run memory_budget 70 benchmarks/memory_budget.py --quick
run training_memory 50 benchmarks/training_memory.py --quick
run licm 40 benchmarks/licm.py --quick
