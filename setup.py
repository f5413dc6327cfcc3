"""ament_python package that also installs with plain `pip install -e .` (no colcon)."""
from glob import glob

from setuptools import find_packages, setup

package_name = 'vla_spec_ros'

setup(
    name=package_name,
    version='0.1.0',
    # The top-level kernels/ folder is installed as vla_spec_ros.kernels.
    packages=find_packages(exclude=['test', 'test.*', 'bench', 'kernels'])
    + ['vla_spec_ros.kernels'],
    package_dir={'vla_spec_ros.kernels': 'kernels'},
    package_data={'vla_spec_ros': ['assets/**/*']},
    include_package_data=True,
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        ('share/' + package_name + '/launch', glob('launch/*.launch.py')),
        ('share/' + package_name + '/config', glob('config/*.yaml')),
    ],
    python_requires='>=3.10',
    # torch: install the build for your machine first (CPU: `pip install torch==2.13.0`).
    install_requires=['torch>=2.4', 'numpy', 'safetensors', 'tokenizers', 'transformers>=4.40',
                      'opencv-python-headless', 'simplejpeg', 'Pillow', 'tqdm'],
    extras_require={
        # ROS 2 from PyPI wheels, for machines without a ROS distro install; rosbags (pure
        # Python) reads and writes bags: train-draft --bag, recording.FrameRecorder;
        # trajectory_msgs: a chunked model's ~/trajectory (docs/chunks.md).
        'ros': ['ros-kilted-rclpy[fastrtps]', 'ros-kilted-sensor-msgs',
                'ros-kilted-geometry-msgs', 'ros-kilted-std-msgs', 'ros-kilted-std-srvs',
                'ros-kilted-diagnostic-msgs', 'ros-kilted-lifecycle-msgs',
                'ros-kilted-trajectory-msgs', 'rosbags>=0.11,<0.12'],
        'sim': ['metaworld==3.1.1', 'matplotlib'],
        'kernels': ['triton'],
        # colcon: test_colcon_build; ament_cmake + rosidl generators (with cmake and a C/C++
        # compiler) build control_msgs' gripper actions and moveit_msgs' ServoCommandType
        # (test/ros_interfaces.py); scipy's Rotation checks the pose math.
        'test': ['pytest', 'flake8', 'pyyaml', 'scipy', 'colcon-core', 'colcon-ros',
                 'colcon-python-setup-py', 'catkin-pkg', 'ros-kilted-ament-package',
                 'ros-kilted-ament-cmake', 'ros-kilted-ament-cmake-include-directories',
                 'ros-kilted-ament-cmake-ros-core', 'ros-kilted-rosidl-default-generators',
                 'ros-kilted-rosidl-core-generators'],
    },
    zip_safe=True,
    maintainer='vla_spec_ros maintainers',
    maintainer_email='maintainers@vla-spec-ros.invalid',
    description='Pipelined + speculative OpenVLA inference for ROS 2',
    license='Apache-2.0',
    tests_require=['pytest'],
    entry_points={
        'console_scripts': [
            'vla-spec = vla_spec_ros.cli:main',
            'vla-spec-node = vla_spec_ros.ros.node:main',
            'vla-spec-lifecycle-node = vla_spec_ros.ros.lifecycle_node:main',
            'vla-spec-sim-bridge = vla_spec_ros.harness.sim_bridge:main',
        ],
    },
)
