"""The machine and checkout a `vla-spec demo` run was on: `machine_info` for the record's
'machine' entry (platform, library versions, torch threads and CUDA device, the load average
at the start, the git commit with how many tracked files differ from it), and `load_average`,
which the lock-step runner records at the end of each row.

Contracts: every field is best effort (None where the library, device, load average or
checkout is absent); nothing here raises for a missing library or a missing git.
"""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path


def load_average() -> list | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    info = {'platform': platform.platform(), 'python': platform.python_version(),
            'processor': platform.processor() or platform.machine(),
            'cpu_count': os.cpu_count(), 'MUJOCO_GL': os.environ.get('MUJOCO_GL')}
    for name in ('torch', 'metaworld', 'mujoco', 'rclpy'):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    try:
        import torch
        info['torch_threads'] = torch.get_num_threads()
        info['cuda'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info['cuda'] = None
    try:
        info['load_avg_at_start'] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    info['git'] = _git_state()
    return info


def _git_state() -> str | None:
    """The checkout's commit, and how many files differ from it (None outside a checkout)."""
    import subprocess
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=root, text=True,
                                capture_output=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'],
                                 cwd=root, text=True, capture_output=True, timeout=10,
                                 check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + (f' + {len(changed)} changed files' if changed else '')


__all__ = ['load_average', 'machine_info']
