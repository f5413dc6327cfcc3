#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs the whole suite.
# (The README's second set-up command.)
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  # Off-screen MuJoCo rendering on CPU for the simulator tests.
  (apt-get update -qq && apt-get install -y -qq libosmesa6 >/dev/null) \
    || echo "warning: libosmesa6 not installed; simulator tests will be skipped"
fi
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[ros,sim,kernels,test]"
export MUJOCO_GL="${MUJOCO_GL:-osmesa}"
export VLA_SPEC_CACHE="${VLA_SPEC_CACHE:-$(mktemp -d)}"
python3 -m flake8 vla_spec_ros kernels test bench launch
python3 -m pytest -q -p no:cacheprovider test "$@"
