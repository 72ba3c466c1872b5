#!/usr/bin/env bash
# The whole fast test suite on a machine with a CUDA GPU, as a newcomer with one
# runs it (`python -m pytest`), in one command that ends inside ten minutes.
# Pass 1 runs every test on WORKERS processes (pytest-xdist) and lists, test by
# test, what failed, so a pass cut off by its limit still says what failed so
# far; pass 2 runs up to 40 of those again in one process with their tracebacks.
# Every limit and kill delay, added up, is 580 s at most.
#
#     OUT=<folder> bash benchmarks/gpu_suite.sh     # from the repository root
#
# Results in $OUT: suite.log (pass 1), failed.txt (one test id a line) and,
# when something failed, rerun.log (pass 2). Exit 0 when pass 1 passed whole.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
WORKERS="${WORKERS:-16}"
KILL_AFTER=5  # seconds between a limit's SIGTERM and SIGKILL

# pass 1: -v writes each result as it comes ("[gw3] [ 41%] FAILED tests/..."), and
# -rfE the summary at the end; the benchmark plugin is off under xdist anyway
timeout -k "$KILL_AFTER" 420 "$PY" -m pytest -p no:cacheprovider -p no:benchmark \
  -n "$WORKERS" -v --tb=no -rfE -o timeout=200 >"$OUT/suite.log" 2>&1
rc=$?
grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/suite.log" | cut -d' ' -f2 | sort -u \
  >"$OUT/failed.txt"
failed=$(wc -l <"$OUT/failed.txt")
echo "gpu_suite: pass 1 exit $rc ($([ "$rc" -ge 124 ] && echo "cut off by its 420 s limit" \
  || echo "finished")); $failed failed: $OUT/failed.txt"
tail -n 3 "$OUT/suite.log"

if [ "$failed" -gt 0 ]; then
  # pass 2: the failures alone, with their tracebacks (a module fixture's error
  # is listed once per test: the ids are given as they are)
  head -n 40 "$OUT/failed.txt" | xargs -d '\n' timeout -k "$KILL_AFTER" 150 "$PY" -m pytest \
    -p no:cacheprovider -p no:benchmark -q --tb=short -o timeout=100 >"$OUT/rerun.log" 2>&1
  echo "gpu_suite: pass 2 (the first $((failed < 40 ? failed : 40)) again) exit $?: $OUT/rerun.log"
  tail -n 3 "$OUT/rerun.log"
fi
exit "$rc"
