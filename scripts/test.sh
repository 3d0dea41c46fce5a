#!/usr/bin/env bash
# test.sh: set up (scripts/setup.sh), then run the whole test suite with pytest.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -x tests/core runs only that folder). The suite runs in one
# process: with two pytest-xdist workers (-n 2 --dist loadfile, installed) each worker's engines, servers and
# transformers references outgrew CI's 24 GB, so -n 2 is only for a bigger machine.
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

PYTEST_ARGS=(-q --durations=10)
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
