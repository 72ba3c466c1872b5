# The two commands session 21 ran on the lent H200 (2026-11-27), as run, from the
# repository root at commit 1a02860, with the MNIST-1D cache copied into the ignored .gpucarry/.

# call 1: bash .gpucarry/device_run.sh  (run1-* files; this script as it was)
# session 21 device checks: runbook, inf33 mutant, main job on cuda, full CPU suite with CUDA present
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
E="$OUT/extra.log"
s=$SECONDS
timeout -k 5 300 env COMMIT=1a02860 bash benchmarks/gpu_runbook.sh >"$OUT/runbook-stdout.txt" 2>&1
echo "runbook rc $? in $((SECONDS-s)) s" | tee -a "$E"
rm -f "$OUT/runbook-stdout.txt"
{
echo "== inf33 mutant (from_dense(w.detach()) in nm/export.py)"
T=tests/test_mutation_gaps_infer.py::test_to_semi_structured_converts_a_transposed_weight
cp src/feather_sparse/nm/export.py /tmp/exp.bak
sed -i 's/from_dense(w.detach().contiguous())/from_dense(w.detach())/' src/feather_sparse/nm/export.py
diff /tmp/exp.bak src/feather_sparse/nm/export.py
timeout -k 5 120 python3 -m pytest -p no:cacheprovider -q -rA "$T" 2>&1 | tail -15
echo "mutant pytest exit ${PIPESTATUS[0]}"
cp /tmp/exp.bak src/feather_sparse/nm/export.py
timeout -k 5 120 python3 -m pytest -p no:cacheprovider -q "$T" 2>&1 | tail -3
echo "unmutated pytest exit ${PIPESTATUS[0]}"
echo "== main job on cuda (README's command, data from the carried cache)"
s=$SECONDS
timeout -k 5 120 python3 -m feather_sparse train --device cuda --data-dir .gpucarry --run-dir /tmp/r1 2>&1 | tail -22
echo "main job exit ${PIPESTATUS[0]} in $((SECONDS-s)) s"
echo "== the whole fast suite with a CUDA device present (python -m pytest, xdist -n 12)"
s=$SECONDS
timeout -k 5 230 python3 -m pytest -p no:cacheprovider -q -n 12 --tb=short -o timeout=200 2>&1 | tail -150
echo "suite exit ${PIPESTATUS[0]} in $((SECONDS-s)) s"
} 2>&1 | tee -a "$E"
cat "$OUT/summary.txt"

# call 2 (run2-suite-with-cuda.txt; the lines of $OUT/suite.log kept there):
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src; timeout -k 5 285 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 16 -v --tb=short -o timeout=200 > $OUT/suite.log 2>&1; echo "suite exit $?"
