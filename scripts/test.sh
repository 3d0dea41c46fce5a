#!/usr/bin/env bash
# test.sh: set up (scripts/setup.sh), then run the whole test suite with pytest.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -x tests/core runs only that folder). The suite runs on
# pytest-xdist workers, one per core up to TEST_WORKERS (default 2), a test file at a time (--dist loadfile, so a
# module's shared server serves all its tests), each worker and every process it starts with one compute thread
# (OMP_NUM_THREADS=1: two workers' thread pools on two cores would fight over them). TEST_WORKERS=0 runs in one
# process.
# Exits with pytest's code, except that "no tests collected" (5) counts as a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/setup.sh"

# Nothing comes from a model hub at run time (README.md, docs/setup.md); fail fast instead of waiting on the network.
export HF_HUB_OFFLINE=1

# The whole tests/ folder, unless the arguments name test paths of their own.
TARGETS=(tests)
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
        TARGETS=()
        break
    fi
done

WORKERS="${TEST_WORKERS:-2}"
# The CPUs this process may run on (not `nproc`, which answers OMP_NUM_THREADS when that is set).
CORES="$("$ROOT/.venv/bin/python" -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || echo 1)"
(( WORKERS > CORES )) && WORKERS=$CORES
PYTEST_ARGS=(-q --durations=10)
if (( WORKERS > 1 )); then
    PYTEST_ARGS+=(-n "$WORKERS" --dist loadfile)
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
echo "[test] .venv/bin/python -m pytest ${PYTEST_ARGS[*]} ${TARGETS[*]} $*"
set +e
"$ROOT/.venv/bin/python" -m pytest "${PYTEST_ARGS[@]}" "${TARGETS[@]}" "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "[test] error: pytest collected no tests" >&2
    exit 1
fi
exit $rc
