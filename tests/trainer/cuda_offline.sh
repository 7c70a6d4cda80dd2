#!/usr/bin/env bash
# The CUDA checks (tests/trainer/cuda_paths.py) on a GPU machine without internet whose python3
# has torch: installs the rest from the wheels `make gpu-wheels` put in out/wheels (made where
# PyPI is reached, carried here with the checkout), then runs the checks. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
if [[ ! -s out/wheels/requirements.txt || ! -s out/wheels/if-missing.txt ]]; then
  echo "out/wheels has no requirements.txt: run 'make gpu-wheels' where PyPI is reached, and carry out/wheels here" >&2
  exit 2
fi
"$PYTHON" -c 'import torch; print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")'
# --no-deps: exactly the trainer lock's versions; torch and its own dependencies stay the machine's.
install=(-m pip install -q --no-index --no-deps --find-links out/wheels)
"$PYTHON" "${install[@]}" -r out/wheels/requirements.txt
missing=$("$PYTHON" -c '
import importlib.util, sys
wanted = {"numpy": "numpy", "scikit-learn": "sklearn"}
pins = [line.strip() for line in open(sys.argv[1]) if line.strip()]
print(" ".join(pin for pin in pins if importlib.util.find_spec(wanted[pin.split("==")[0]]) is None))
' out/wheels/if-missing.txt)
if [[ -n "$missing" ]]; then
  echo "installing what this machine lacks: $missing"
  # shellcheck disable=SC2086  # one argument per pin
  "$PYTHON" "${install[@]}" $missing
fi
exec "$PYTHON" -m pytest -p no:cacheprovider --confcutdir=tests/trainer tests/trainer/cuda_paths.py -v -s "$@"
