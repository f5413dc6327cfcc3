#!/usr/bin/env bash
# Installs the package with its ROS 2 wheels and the simulator on a fresh machine, then runs the
# main job: the embedded Meta-World model driven closed-loop through the real ROS 2 node and the
# simulator bridge, once per decoding mode (the README's first set-up command).
# Extra arguments go to `vla-spec demo` (e.g. --episodes 20 --out bench/results/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ros,sim,kernels
exec vla-spec demo "$@"
