#!/usr/bin/env bash
# test.sh: set up (scripts/setup.sh), then run the whole test suite with pytest.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -x tests/core runs only that folder; -n 0 runs in one process).
# Two pytest-xdist workers share the test files, one per core of CI's machine; --dist loadfile keeps a file's
# tests on one worker, so a module-scoped server starts once.
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

PYTEST_ARGS=(-q -n 2 --dist loadfile --durations=10)
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
