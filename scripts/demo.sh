#!/usr/bin/env bash
# Installs the package with its ROS 2 wheels and the simulator on a fresh machine, then runs the
# main job (the README's first set-up command), about 4 minutes on 2 CPU cores: the embedded
# Meta-World model in lock-step through the real ROS 2 node and the simulator bridge once per
# decoding mode, model-only speed against the Hugging Face baseline, and success against
# action delay with each mode's latency placed on it.
# Extra arguments go to `vla-spec demo` (e.g. --full for the recorded sweeps, about two hours;
# --verbose for the nodes' log lines).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ros,sim,kernels
exec vla-spec demo "$@"
