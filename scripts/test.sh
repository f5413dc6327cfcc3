#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs the whole suite.
# (The README's second set-up command.)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ros,sim,kernels,test
export VLA_SPEC_CACHE="${VLA_SPEC_CACHE:-$(mktemp -d)}"
python3 -m flake8 vla_spec_ros kernels test bench launch
python3 -m pytest -q -p no:cacheprovider test "$@"
