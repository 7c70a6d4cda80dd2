#!/usr/bin/env bash
# The CUDA checks (tests/trainer/cuda_paths.py) on a GPU machine without internet whose python3
# has torch: installs what that Python lacks from the wheels `make gpu-wheels` put in out/wheels
# (made where PyPI is reached, carried here with the checkout), then runs the checks. Arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
if [[ ! -s out/wheels/requirements.txt ]]; then
  echo "out/wheels has no requirements.txt: run 'make gpu-wheels' where PyPI is reached, and carry out/wheels here" >&2
  exit 2
fi
"$PYTHON" -c 'import torch; print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")'
# Only what is missing, at the trainer lock's version (--no-deps): a package the machine has
# stays as it is, so nothing its own tools need is changed under them.
missing=$("$PYTHON" - out/wheels/requirements.txt <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

have, lack = [], []
for pin in filter(None, (line.strip() for line in open(sys.argv[1]))):
    name = pin.split("==")[0]
    try:
        have.append(f"{name} {version(name)}")
    except PackageNotFoundError:
        lack.append(pin)
print("kept as installed:", ", ".join(have) or "none", file=sys.stderr)
print(" ".join(lack))
PY
)
if [[ -n "$missing" ]]; then
  echo "installing: $missing"
  # shellcheck disable=SC2086  # one argument per pin
  "$PYTHON" -m pip install -q --no-index --no-deps --find-links out/wheels $missing
fi
# The machine's own pytest plugins (xdist, cov, benchmark, ...) stay out of this run.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
exec "$PYTHON" -m pytest -p pytest_timeout -p no:cacheprovider --confcutdir=tests/trainer \
  tests/trainer/cuda_paths.py -v -s "$@"
