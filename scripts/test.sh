#!/usr/bin/env bash
# test.sh: set up (scripts/setup.sh), then run the whole test suite with pytest.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -x tests/core). Exits with pytest's code,
# except that "no tests collected" (5) counts as a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/setup.sh"

echo "[test] .venv/bin/python -m pytest -q tests $*"
set +e
"$ROOT/.venv/bin/python" -m pytest -q tests "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "[test] error: pytest collected no tests" >&2
    exit 1
fi
exit $rc
