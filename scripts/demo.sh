#!/usr/bin/env bash
# Installs the package with its ROS 2 wheels and the simulator on a fresh machine, then runs the
# main job (the README's first set-up command), about 11 minutes on 2 CPU cores: every decoding
# mode behind the real ROS 2 node fed by a 30 Hz camera of consecutive control steps (the speed
# measurement: frames answered, frame -> twist latency, against AR and the Hugging Face
# baseline), the embedded Meta-World model in lock-step through the node and the simulator
# bridge (success), model-only speed, and success against action delay with each mode's
# streaming latency placed on it; then the embedded pi0-FAST model (metaworld-demo-fast) and
# the embedded reasoning model (metaworld-demo-reason): each one's stream, model-only speed and
# real-time success through the node, as a record of its own.
# Extra arguments go to `vla-spec demo` (e.g. --full for the recorded sweeps, about two hours;
# --verbose for the nodes' log lines).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ros,sim,kernels
exec vla-spec demo "$@"
