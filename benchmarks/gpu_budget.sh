#!/usr/bin/env bash
# Issue 30's byte budgets on a GPU machine (the transformer at issue 30's size, the ResNet and the largest
# batches, both orders), then the planner's quick set; each bounded in time, each log in $OUT.
# Run from the repository root on a machine whose python3 has JAX with CUDA, Flax and optax:
#   bash benchmarks/gpu_budget.sh
OUT=${OUT:-/tmp/gpu-bench}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
run() { local name=$1 limit=$2; shift 2
  echo "== $name ($*)"; timeout "$limit" "$PY" "$@" > "$OUT/$name.txt" 2>&1; echo "   rc $? after ${SECONDS}s"; tail -4 "$OUT/$name.txt"; }
nvidia-smi -L; $PY -c "import jax, flax, optax, jaxform; print(jax.__version__, flax.__version__, jax.devices())" || exit 1
run budget_big 240 benchmarks/memory_budget.py --big --quick
run budget_grad_first 120 benchmarks/memory_budget.py --grad-first --quick
run budget_resnet_batch 100 benchmarks/memory_budget.py --resnet --quick
run planner 60 benchmarks/planner.py --quick --no-transformer
