"""vla_spec_ros: pipelined + speculative OpenVLA inference for ROS 2.

Heavy imports (torch) are deferred so ``import vla_spec_ros`` stays cheap for tools that only
need the configuration or the pure-Python parts.
"""
__version__ = '0.1.0'

__all__ = ['VLAPolicy', 'ActionResult', 'Frame', 'EngineConfig']


def __getattr__(name):
    if name == 'VLAPolicy':
        from .policy import VLAPolicy
        return VLAPolicy
    if name in ('ActionResult', 'Frame'):
        from .engine import result
        return getattr(result, name)
    if name == 'EngineConfig':
        from .config import EngineConfig
        return EngineConfig
    raise AttributeError(name)
