"""The node convention every draft tree follows, one level below the rooms that share it: the
trees (engine/drafting/) and the step plan (engine/device/step_inputs.py) both read it, and
neither imports the other for it.

Node ``ROOT`` (index 0) is the root: the last token already decided. Its stored parent is
``NO_PARENT``; every other node's parent has a smaller index than the node itself.
"""
from __future__ import annotations

ROOT = 0            # index of the root node in every tree
NO_PARENT = -1      # parent index stored for the root

__all__ = ['ROOT', 'NO_PARENT']
