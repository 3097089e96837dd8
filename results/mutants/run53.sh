#!/bin/bash
# Mutants of the run-folder ownership and layout checks (issue #53): each must fail the named tests.
# Run from the project root on a clean tree: bash results/mutants/run53.sh (each file is restored with git checkout).
set -u
export HF_HUB_OFFLINE=1
mutate() {  # file, python-literal old, python-literal new, pytest -k expression
  python - "$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert text.count(old) == 1, (path, old)
open(path, "w").write(text.replace(old, new))
PY
  if python -m pytest -q -x test_all.py -k "$4" > /tmp/mutant.log 2>&1; then
    echo "SURVIVED: $1: $2 -> $3"
  else
    echo "killed:   $1: $2 -> $3 ($(grep -m1 -o 'FAILED [^ ]*' /tmp/mutant.log))"
  fi
  git checkout -q "$1"
}
mutate plumbing.py "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)" "pass" "one_writer"
mutate plumbing.py "        elif saved[name] != trained[name]:" "        elif False:" "hostile and edited"
mutate plumbing.py '[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*' '[0-9_]+(-[0-9]*)?(,[0-9]+(-[0-9]+)?)*' "hostile and seeds"
mutate plumbing.py "ctypes.CDLL(None).prctl(1, signal.SIGTERM)" "None" "killed_sweeps"
mutate plumbing.py "os.environ.get(SWEEP_ENV) == parent == os.path.dirname(real)" "True" "hostile and seed1"
mutate envs.py "if heavy else pushers[0] in reach" "if False else pushers[0] in reach" "hostile and heavy_alone"
mutate envs.py "return f\"agent {i + 1} (at {self.where(start)}) can reach nothing to act on\"" "pass" "hostile and pocket"
