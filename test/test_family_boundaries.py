"""A family is one folder: no code outside ``models/<family>/`` names a family, the registry
table holds every family folder once, and reading the table imports no torch.

"Naming a family" is what a branch on the family needs: importing from its folder
(``vla_spec_ros.models.<family>...``, relative imports resolved), an identifier that contains
its name (``Pi0FastConfig``, ``make_openvla``), its config class by name (``VLAConfig``), or a
string that is its name (``family == 'pi0fast'``). Docstrings and comments may speak of a
family; code may not. The one exception is the registry's registration line of each family
(its folder's name in models/registry.py's ``FAMILY_FOLDERS``). Tests and bench/ scripts are
per family by nature and are not scanned.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from test_import_graph import KERNELS_ROOT, PACKAGE_ROOT, _imports, _module_name

LAUNCH_ROOT = PACKAGE_ROOT.parent / 'launch'
REGISTRY = PACKAGE_ROOT / 'models' / 'registry.py'


def _family_folders() -> list[str]:
    """The family folders: every folder of Python files under models/ (a family is one folder;
    the generic model code sits in models/ itself)."""
    return sorted(p.name for p in (PACKAGE_ROOT / 'models').iterdir()
                  if p.is_dir() and any(p.glob('*.py')))


def _family_terms() -> tuple[set, set]:
    """(lower-case family names, the families' config class names), read from the entries'
    sources (no import)."""
    names, classes = set(), set()
    for name in _family_folders():
        names.add(name.lower())
        entry = PACKAGE_ROOT / 'models' / name / 'entry.py'
        tree = ast.parse(entry.read_text()) if entry.is_file() else ast.Module(body=[])
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == 'config_class':
                classes.add(node.value.id)
    return names, classes


def _docstrings(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            out.add(id(node.body[0].value))
    return out


def _registration(tree) -> set:
    """ids of the registry's registration lines: the strings of ``FAMILY_FOLDERS = (...)``."""
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and [getattr(t, 'id', None) for t in node.targets] \
                == ['FAMILY_FOLDERS']:
            allowed.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return allowed


def family_mentions(path: Path, source: str | None = None) -> list[str]:
    """Where ``path`` (``source``: its text, when not the one on disk) names a family."""
    names, classes = _family_terms()
    families = _family_folders()
    text = path.read_text() if source is None else source
    tree = ast.parse(text, str(path))
    skip = _docstrings(tree) | (_registration(tree) if path == REGISTRY else set())
    prefixes = tuple(f'vla_spec_ros.models.{f}' for f in families)
    found = []
    if path.is_relative_to(LAUNCH_ROOT):       # launch files import absolutely
        imported = {n.module or '' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    else:
        imported = _imports(path, text)
    for name in sorted(imported):
        if name.startswith(prefixes):
            found.append(f'imports {name}')
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            words = [node.arg]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            words = [alias.asname or alias.name.split('.')[-1] for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.lower() in names:
                found.append(f'line {node.lineno}: the string {node.value!r}')
            continue
        else:
            continue
        for word in words:
            if word in classes or any(n in word.lower() for n in names):
                found.append(f'line {node.lineno}: {word}')
    return found


def _sources() -> list[Path]:
    family_dirs = [PACKAGE_ROOT / 'models' / f for f in _family_folders()]
    paths = sorted(PACKAGE_ROOT.rglob('*.py')) + sorted(KERNELS_ROOT.rglob('*.py')) \
        + sorted(LAUNCH_ROOT.glob('*.py'))
    return [p for p in paths if not any(p.is_relative_to(d) for d in family_dirs)]


@pytest.mark.parametrize('path', _sources(), ids=lambda p: str(p.relative_to(PACKAGE_ROOT.parent)))
def test_no_code_outside_a_family_folder_names_a_family(path):
    found = family_mentions(path)
    assert not found, (f'{path.relative_to(PACKAGE_ROOT.parent)} names a family outside '
                       f'models/<family>/ (ask models/registry.py instead): {found}')


def test_the_scanner_sees_a_branch_on_the_family():
    """The rule above is not vacuous: a branch on the family's name, an isinstance of its config
    class, an import of its folder (relative, inside a function) and an identifier carrying its
    name are each seen, in a module that has none of them on disk."""
    path = PACKAGE_ROOT / 'harness' / 'demo_options.py'
    assert not family_mentions(path)
    for snippet, expected in [
            ("\n\ndef f(raw):\n    return raw.get('family') == 'pi0fast'\n", "'pi0fast'"),
            ('\n\ndef f(cfg):\n    return isinstance(cfg, VLAConfig)\n', 'VLAConfig'),
            ('\n\ndef f():\n    from ..models.openvla import preprocess\n', 'models.openvla'),
            ('\n\ndef make_pi0fast_checkpoint():\n    pass\n', 'make_pi0fast_checkpoint')]:
        found = family_mentions(path, path.read_text() + snippet)
        assert any(expected in f for f in found), (snippet, found)
    # The registry's registration lines are allowed there, and only there.
    registration = "FAMILY_FOLDERS = (\n    'openvla',\n    'pi0fast',\n)\n"
    assert not family_mentions(REGISTRY, registration)
    assert family_mentions(path, registration)
    assert family_mentions(REGISTRY, registration + "FALLBACK = 'openvla'\n")
    assert family_mentions(REGISTRY, registration + 'from .openvla.entry import FAMILY\n')


def test_every_family_folder_is_registered_once_under_its_own_name():
    """A folder under models/ is a family: its entry.py defines its record, named as the
    folder, and the registry table lists it (its one line)."""
    from vla_spec_ros.models import registry
    from vla_spec_ros.models.family import Family
    assert sorted(registry.FAMILIES) == sorted(registry.FAMILY_FOLDERS) == _family_folders()
    assert {'openvla', 'pi0fast'} <= set(registry.FAMILIES)
    for name, family in registry.FAMILIES.items():
        assert isinstance(family, Family) and family.name == name
        entry = __import__(f'vla_spec_ros.models.{name}.entry', fromlist=['FAMILY'])
        assert entry.FAMILY is family
        for preset_name in family.presets:
            assert registry.family_of_preset(preset_name) == name
            assert isinstance(registry.preset(preset_name), family.config_class)
    assert sum(f.is_default for f in registry.FAMILIES.values()) == 1


# Each family's smallest preset, for the checks that build its model (a new family adds its own).
SMALL_PRESETS = {'openvla': 'tiny', 'pi0fast': 'pi0fast-tiny', 'ecot': 'ecot-tiny'}


def test_a_family_model_reports_its_entrys_default_draft(tmp_path):
    """The registry's default_draft is what the family's models tell the engine
    (models/protocol.py: a model's ``default_draft``), for a checkpoint of every family."""
    pytest.importorskip('torch')
    from vla_spec_ros.models import registry
    assert sorted(SMALL_PRESETS) == sorted(registry.FAMILIES)
    for name, preset_name in SMALL_PRESETS.items():
        loaded = registry.load(registry.make_checkpoint(preset_name, tmp_path / name, seed=0))
        assert loaded.family == name
        assert loaded.model.default_draft == registry.family(name).default_draft


def test_detection_takes_the_one_family_that_claims_a_folder():
    from vla_spec_ros.models import registry
    from vla_spec_ros.models.weights import CheckpointError
    assert registry.family_of({'type': 'pi0_fast'}) == 'pi0fast'
    assert registry.family_of({'architectures': ['OpenVLAForActionPrediction']}) == 'openvla'
    assert registry.family_of({}) == registry.DEFAULT_FAMILY.name == 'openvla'
    claims_all = registry.Family(
        name='greedy', config_class=type('GreedyConfig', (), {}), presets={'x': object},
        detects=lambda raw: True, load=None, make_checkpoint=None, action_chunk=None,
        default_draft='previous_action')
    saved = dict(registry.FAMILIES)
    try:
        registry.FAMILIES['greedy'] = claims_all
        with pytest.raises(CheckpointError, match='several families'):
            registry.detect({'type': 'pi0_fast'})
    finally:
        registry.FAMILIES.clear()
        registry.FAMILIES.update(saved)


def test_make_checkpoint_refuses_an_option_of_another_family(tmp_path):
    from vla_spec_ros.models import registry
    with pytest.raises(ValueError, match='num_image_slots'):
        registry.make_checkpoint('tiny', tmp_path / 'x', num_image_slots=2)
    with pytest.raises(ValueError, match='max_shard_bytes'):
        registry.make_checkpoint('pi0fast-tiny', tmp_path / 'y', max_shard_bytes=1 << 20)
    assert not (tmp_path / 'x').exists() and not (tmp_path / 'y').exists()


def test_reading_the_registry_table_imports_no_torch():
    """The table and the presets (the CLI's choices) cost no torch import: the entries' hooks
    import their family's modules when called."""
    code = ('import sys\nfrom vla_spec_ros.models import registry\n'
            'registry.preset("tiny"); registry.family_of_preset("pi0fast-tiny")\n'
            'assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)\n')
    subprocess.run([sys.executable, '-c', code], check=True, timeout=120,
                   cwd=str(PACKAGE_ROOT.parent))


def test_the_module_name_helper_is_shared():
    assert _module_name(REGISTRY) == 'vla_spec_ros.models.registry'


@pytest.mark.parametrize('kind', ['pi0', 'smolvla', 'act'])
def test_a_lerobot_policy_of_another_type_is_refused_by_name(tmp_path, kind):
    """It used to fall to the default family and fail on a vision tower it does not have."""
    import json

    from vla_spec_ros.models import registry
    from vla_spec_ros.models.weights import CheckpointError
    (tmp_path / 'config.json').write_text(json.dumps({'type': kind, 'chunk_size': 50}))
    with pytest.raises(CheckpointError, match=f"LeRobot policy type '{kind}' is not supported; "
                                              'the LeRobot types read here are '
                                              'pi0_fast / pi0fast') as info:
        registry.load(tmp_path)
    assert str(tmp_path / 'config.json') in str(info.value)
    assert registry.family_of({'type': 'pi0fast'}) == 'pi0fast'
    assert registry.family_of({'type': 'x', 'model_type': 'openvla'}) == 'openvla'
