#!/usr/bin/env bash
# Everything this project measures on a CUDA GPU, in one command that ends
# inside ten minutes: the gpu-marked tests, then the GPU timings (a 2:4
# semi-structured Linear vs dense, a training step vs dense, threshold
# selection, the N:M step on the bundled models). Each part has its own time
# limit and exit status; a failing part does not stop the others, and a part
# that outlives its limit is killed KILL_AFTER seconds later even if it
# ignores SIGTERM. Every limit and kill delay, added up, is 565 s at most.
# Results go to $OUT (one file a part, plus env.txt and summary.txt: 7 files,
# of the 8 a lent GPU machine sends back), or to a new temporary folder.
#
#     bash benchmarks/gpu_runbook.sh            # from the repository root
#     COMMIT=<hash> bash benchmarks/gpu_runbook.sh  # in a copy without .git
#
# Without a CUDA device it says so, writes env.txt and exits 1.
# Python packages the GPU machine lacks can be carried as wheels in .whl/
# (installed into /tmp/site first); the library itself is used from src/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
KILL_AFTER=5  # seconds between a limit's SIGTERM and SIGKILL

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

{
  date -u
  # COMMIT first: a copy of the tree may carry a stale .git (a lent GPU machine's did)
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo "unknown (no .git here: set COMMIT)")}"
  timeout -k "$KILL_AFTER" 10 nvidia-smi 2>&1 || echo "nvidia-smi: failed or not found"
  timeout -k "$KILL_AFTER" 30 "$PY" - <<'EOF'
import importlib.util
import platform
import torch
print(f"Python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
# what the gpu tests import besides torch (carry the missing ones as wheels in .whl/)
need = ("pytest", "pytest_timeout", "hypothesis", "numpy")
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("packages the gpu tests need:", f"missing {', '.join(missing)}" if missing else "all present")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU 0: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB")
EOF
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout -k "$KILL_AFTER" 45 "$PY" -c \
  "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
cuda=$?
if [ "$cuda" -ge 124 ]; then
  echo "gpu_runbook: asking torch for a CUDA device took over 45 s (exit $cuda); see env.txt" >&2
  exit 1
elif [ "$cuda" -ne 0 ]; then
  echo "gpu_runbook: this torch sees no CUDA device; run it on a machine with an NVIDIA GPU" >&2
  exit 1
fi

summary="$OUT/summary.txt"
: >"$summary"
part() {  # part NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  local start=$SECONDS
  timeout -k "$KILL_AFTER" "$limit" "$@" >"$OUT/$name" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name"
  echo "$name: exit $rc in $((SECONDS - start)) s (limit $limit s): $*" | tee -a "$summary"
}

# the tests that need CUDA: every gpu-marked test (the CPU suite runs in CI); a test
# stuck in Python fails alone after 120 s (pytest-timeout), and the rest still run.
# cuBLAS is deterministic only with this workspace setting (deterministic = true runs).
part gpu-tests.log 180 env CUBLAS_WORKSPACE_CONFIG=:4096:8 \
  "$PY" -m pytest -p no:cacheprovider -q -m gpu -ra --durations=15 -o timeout=120 \
  $(grep -l "mark.gpu\|marks=pytest.mark.gpu" tests/test_*.py)
part nm-linear.md 60 "$PY" benchmarks/bench_nm_linear_gpu.py --dtype float16 --tokens 4096 32768
part train-step.md 90 "$PY" benchmarks/bench_train_step.py --device cuda --repeats 11
part selection.md 55 "$PY" benchmarks/bench_selection.py --device cuda --sizes 1.1 25.6 100
part nm-step.md 55 "$PY" benchmarks/bench_nm_step.py --device cuda --micro 1 --repeats 21
cat "$summary"
! grep -qv ": exit 0 in" "$summary"
