#!/usr/bin/env bash
# Installs the package with its ROS 2 wheels and the simulator on a fresh machine, then runs the
# main job: the embedded Meta-World model driven closed-loop through the real ROS 2 node and the
# simulator bridge, once per decoding mode (the README's first set-up command).
# Extra arguments go to `vla-spec demo` (e.g. --episodes 20 --out bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  # Off-screen MuJoCo rendering on CPU.
  (apt-get update -qq && apt-get install -y -qq libosmesa6 >/dev/null) \
    || echo "warning: could not install libosmesa6; set MUJOCO_GL to a renderer you have"
fi
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[ros,sim,kernels]"
export MUJOCO_GL="${MUJOCO_GL:-osmesa}"
exec vla-spec demo "$@"
