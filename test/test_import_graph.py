"""Imports flow one way: models <- engine <- policy <- ros <- harness, and sim beside ros; the
`testing` doubles never reach the product layers.

Reads every module's source (function-level imports included, relative imports resolved) and
fails when a layer imports one above it. Pure Python: nothing is imported.
"""
import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / 'vla_spec_ros'
KERNELS_ROOT = Path(__file__).resolve().parents[1] / 'kernels'

# layer -> the package layers it must never import (directly or inside a function).
FORBIDDEN = {
    'models': {'engine', 'policy', 'ros', 'sim', 'harness', 'train', 'cli', 'bench', 'testing'},
    'kernels': {'engine', 'policy', 'ros', 'sim', 'harness', 'train', 'cli', 'bench', 'testing'},
    'engine': {'policy', 'ros', 'sim', 'harness', 'train', 'cli', 'bench', 'testing'},
    'policy': {'ros', 'sim', 'harness', 'train', 'cli', 'bench', 'testing'},
    'ros': {'sim', 'harness', 'train', 'cli', 'bench', 'testing'},
    'sim': {'ros', 'harness', 'cli', 'bench'},
    'train': {'ros', 'harness', 'cli', 'bench'},
    'motion': {'engine', 'policy', 'ros', 'sim', 'harness', 'models'},
    'config': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train'},
    'actions': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train'},
    'action_codec': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train'},
    'instruction': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train', 'config'},
    'image_check': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train', 'config'},
    'image_messages': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train'},
    'validation': {'engine', 'policy', 'ros', 'sim', 'harness', 'models', 'train', 'config'},
    'baseline': {'ros', 'sim', 'harness', 'train', 'cli', 'bench', 'testing'},
    'fidelity': {'ros', 'harness', 'train', 'cli', 'bench', 'testing'},
}
# Libraries a layer must not import: the engine never touches ROS (it runs without rclpy).
FORBIDDEN_LIBRARIES = {
    'engine': {'rclpy'}, 'models': {'rclpy'}, 'policy': {'rclpy'}, 'sim': {'rclpy'},
    'train': {'rclpy'}, 'kernels': {'rclpy'},
}


def _module_name(path: Path) -> str:
    if path.is_relative_to(KERNELS_ROOT):
        parts = ('vla_spec_ros', 'kernels') + path.relative_to(KERNELS_ROOT).with_suffix('').parts
    else:
        parts = ('vla_spec_ros',) + path.relative_to(PACKAGE_ROOT).with_suffix('').parts
    if parts[-1] == '__init__':
        parts = parts[:-1]
    return '.'.join(parts)


def _imports(path: Path, source: str | None = None) -> set[str]:
    """Absolute names of every module `path` imports, anywhere in the file (``source``: the
    file's text, when not the one on disk)."""
    module = _module_name(path)
    package = module if path.name == '__init__.py' else module.rsplit('.', 1)[0]
    names = set()
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = base[:len(base) - (node.level - 1)]
                prefix = '.'.join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            names.add(prefix)
            names.update(f'{prefix}.{alias.name}' for alias in node.names)
    return names


def _layer(module: str) -> str | None:
    parts = module.split('.')
    return parts[1] if parts[0] == 'vla_spec_ros' and len(parts) > 1 else None


def _sources():
    return sorted(PACKAGE_ROOT.rglob('*.py')) + sorted(KERNELS_ROOT.rglob('*.py'))


def test_the_scanner_sees_relative_and_function_level_imports(tmp_path):
    # The harness imports the node inside a function and the cli imports relative to itself:
    # both must be seen, or the rules below would pass vacuously.
    closed_loop = _imports(PACKAGE_ROOT / 'harness' / 'closed_loop.py')
    assert 'vla_spec_ros.ros.node' in closed_loop
    cli = _imports(PACKAGE_ROOT / 'cli.py')
    assert 'vla_spec_ros.policy' in cli
    assert len(_sources()) > 40


@pytest.mark.parametrize('path', _sources(), ids=lambda p: str(p.relative_to(p.parents[1])))
def test_imports_flow_one_way(path):
    module = _module_name(path)
    layer = _layer(module)
    forbidden = FORBIDDEN.get(layer, set())
    libraries = FORBIDDEN_LIBRARIES.get(layer, set())
    bad = sorted(name for name in _imports(path)
                 if _layer(name) in forbidden or name.split('.')[0] in libraries)
    assert not bad, f'{module} (layer {layer!r}) imports {bad} against the layering'


# Rooms inside the engine: the scheduling core is plain bookkeeping (no drafting, no device);
# drafting may drive the device side (its own forwards) but not the scheduler; the device side
# imports neither (the draft tree's node convention it needs sits below both, in
# engine/tree_nodes.py); no room imports the strategy or the facade above it
# (engine/packed.py, engine/engine.py).
ROOM_RULES = {
    'scheduling': lambda name: _room(name) in ('drafting', 'device'),
    'drafting': lambda name: _room(name) == 'scheduling',
    'device': lambda name: _room(name) in ('scheduling', 'drafting'),
}
TOP_OF_ENGINE = ('vla_spec_ros.engine.packed', 'vla_spec_ros.engine.engine')


def _room(module: str) -> str | None:
    parts = module.split('.')
    return parts[2] if parts[:2] == ['vla_spec_ros', 'engine'] and len(parts) > 3 else None


@pytest.mark.parametrize('room', sorted(ROOM_RULES))
def test_engine_rooms_import_in_their_direction(room):
    paths = sorted((PACKAGE_ROOT / 'engine' / room).glob('*.py'))
    assert len(paths) > 3
    for path in paths:
        names = _imports(path)
        bad = sorted(n for n in names if ROOM_RULES[room](n) or n.startswith(TOP_OF_ENGINE))
        assert not bad, f'{_module_name(path)} (room {room!r}) imports {bad}'


def test_test_oracles_are_not_shipped():
    """The plain attention rule and the plain tree builder are test oracles (in test/)."""
    oracles = {'plan_step', 'build_dynamic_tree', 'grow_dynamic_tree', 'PartialTree'}
    for path in _sources():
        defined = {node.name for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & oracles, (path, defined & oracles)


def _families() -> list[str]:
    """Every model family: a package under models/ (openvla, pi0fast, ...)."""
    return sorted(p.parent.name for p in (PACKAGE_ROOT / 'models').glob('*/__init__.py'))


def test_the_engine_knows_models_by_the_protocol_only():
    """No engine module, leaf modules of every room included, imports a model family
    (models/openvla/, models/pi0fast/, any package under models/): the runner, the drafters
    and the node's engine see ``models/protocol.VLAModel``; each family implements it. The
    policy reaches the families through the registry only (models/registry.py)."""
    families = _families()
    assert {'openvla', 'pi0fast'} <= set(families)
    prefixes = tuple(f'vla_spec_ros.models.{name}' for name in families)
    engine_sources = sorted((PACKAGE_ROOT / 'engine').rglob('*.py'))
    assert len(engine_sources) > 20          # the rooms' leaf modules are scanned too
    for path in engine_sources:
        family = sorted(n for n in _imports(path)
                        if n.startswith(prefixes) or n == 'vla_spec_ros.models.registry')
        assert not family, (_module_name(path), family)
    policy = sorted(n for n in _imports(PACKAGE_ROOT / 'policy.py') if n.startswith(prefixes))
    assert not policy, policy
    torch = pytest.importorskip('torch')
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.models.openvla.vla import OpenVLA
    from vla_spec_ros.models.pi0fast.model import Pi0Fast
    from vla_spec_ros.models.protocol import Decoder, VLAModel
    for model in (OpenVLA(preset('tiny')), Pi0Fast(preset('pi0fast-tiny'))):
        assert isinstance(model, VLAModel) and isinstance(model.language_model, Decoder)
        assert model.image_embeddings_for(torch.device('cpu')) == model.image_embeddings


def test_the_scanner_catches_a_leaf_module_reaching_a_family():
    """The rule above is not vacuous: a leaf module of an engine room that imports a family
    (relatively, inside a function) is seen."""
    leaf = PACKAGE_ROOT / 'engine' / 'device' / 'kernel_choice.py'
    source = leaf.read_text() + ('\n\ndef _reach():\n'
                                 '    from ...models.pi0fast.model import Pi0Fast\n')
    assert 'vla_spec_ros.models.pi0fast.model' in _imports(leaf, source)
    assert not any(n.startswith('vla_spec_ros.models.pi0fast') for n in _imports(leaf))
