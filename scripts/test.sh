#!/usr/bin/env bash
# Install gputop and its test dependencies into .venv, then lint and run the whole test suite.
# Extra arguments go to pytest (for example: bash scripts/test.sh -k recording).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
# torch runs only inside the user's process; the tests of the probe and of DataLoader workers
# need it. 2.13.0 is the CPU build on the CI machine's local disk (a looser pin pulls a CUDA build).
pip install -q torch==2.13.0 numpy
pip install -q -e '.[test]'
# The exporter's end-to-end test scrapes with a real Prometheus server (Debian's package).
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >/dev/null; }
  else
    echo "scripts/test.sh: install Prometheus (Debian/Ubuntu: apt-get install prometheus) for the exporter test" >&2
  fi
fi
# Lint first (pyproject.toml's [tool.ruff]); set -e fails the run if it finds anything.
ruff check gputop tests benchmarks scripts
# Bytecode for gputop once: the suite starts ~120 gputop processes, and where the environment sets
# PYTHONDONTWRITEBYTECODE (this CI box does) each would compile the package again (~0.4 s of CPU).
python -m compileall -q gputop tests benchmarks >/dev/null
# Two workers (pytest-xdist): most tests wait on real processes (py-spy windows, torchrun ranks,
# Prometheus scrapes), so two at a time halve the wall time on a 2-core box; GPUTOP_TEST_WORKERS=0
# runs them one by one. A short base directory, because a unix socket path holds at most 107
# bytes and the probe tests put sockets under $HOME/.cache inside a test's tmp_path.
# Tests marked serial (a real job's speed, torchrun ranks) run alone, after the rest.
base=$(mktemp -d /tmp/gt.XXXXXX)
trap 'rm -rf "$base"' EXIT
rc=0
python -m pytest -n "${GPUTOP_TEST_WORKERS:-2}" --basetemp "$base/t" -m "not serial" --durations=25 "$@" || rc=$?
python -m pytest --basetemp "$base/s" -m serial "$@" || { r=$?; [ "$r" = 5 ] || rc=$r; }  # 5: none selected
exit "$rc"
