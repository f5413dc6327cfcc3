# Sourced by scripts/test.sh and scripts/demo.sh (from the repository root): installs Debian's
# libosmesa6 for off-screen MuJoCo rendering on CPU when it is missing and apt can run, CPU
# torch, and this package with the extras named in $1; selects OSMesa unless MUJOCO_GL is set.
if command -v apt-get >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  (apt-get update -qq && apt-get install -y -qq libosmesa6 >/dev/null) \
    || echo "warning: libosmesa6 not installed; simulator tests and the demo need an off-screen GL"
fi
# CMake and a C/C++ compiler: test/ros_interfaces.py builds control_msgs' gripper actions and
# moveit_msgs' ServoCommandType (the gripper, parallel-gripper, Servo and pose-target tests).
if command -v apt-get >/dev/null 2>&1 \
    && ! { command -v cmake && command -v cc && command -v c++; } >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq cmake g++ >/dev/null) \
    || echo "warning: cmake / g++ not installed; the gripper and Servo tests will be skipped"
fi
python3 -m pip install -q torch==2.13.0
# --use-pep517: an editable install through setuptools' own hook, which maps the top-level
# kernels/ folder onto vla_spec_ros.kernels; pip's legacy `setup.py develop` path (taken
# without this flag once a newer setuptools is installed, as the launch system's installer
# does) links the source tree only, and vla_spec_ros.kernels would not import.
python3 -m pip install -q --use-pep517 -e ".[$1]"
export MUJOCO_GL="${MUJOCO_GL:-osmesa}"
