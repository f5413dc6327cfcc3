"""A plain install (``pip install -e .[ros]``, no ``test`` extra) loads and runs every model
family: what the loading and prediction paths import must come from setup.py's
``install_requires`` (and what those require), never from an extra.

The check runs the paths in a fresh interpreter where every installed distribution outside
that closure is absent: each finder on ``sys.meta_path`` answers None for its modules, as it
would for a module that is not installed (``import`` raises ModuleNotFoundError,
``importlib.util.find_spec`` returns None, optional imports take their fallback). The closure
is read from setup.py and the installed distributions' metadata. scipy, a ``test`` dependency
that the FAST codec once imported, is among the absent ones here."""
import ast
import importlib.metadata as metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

packaging_requirements = pytest.importorskip('packaging.requirements')

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'vla_spec_ros'

CHILD = r'''
import importlib.machinery, json, sys
ABSENT = frozenset(json.loads(sys.argv[1]))


class Absent:
    """Wraps a finder: the modules of a distribution outside the closure are not found."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in ABSENT:
            return None
        find = getattr(self.finder, 'find_spec', None)
        return find(name, path, target) if find is not None else None

    def invalidate_caches(self):
        getattr(self.finder, 'invalidate_caches', lambda: None)()


present = sorted(m for m in ABSENT if m in sys.modules)    # imported at start-up (site, .pth)
sys.meta_path[:] = [Absent(f) for f in sys.meta_path]

import tempfile
import numpy as np
from vla_spec_ros import VLAPolicy
from vla_spec_ros.models import registry

results = {}
for name in ('metaworld-demo-fast', 'metaworld-demo'):
    policy = VLAPolicy.from_pretrained(name)
    size = policy.model_config.image_size
    image = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    result = policy.predict(image, 'open the drawer', policy.unnorm_keys[0])
    results[name] = list(np.shape(result.action))
with tempfile.TemporaryDirectory() as folder:
    # A random pi0-FAST checkpoint fits its FAST tokenizer (the DCT) while it is written.
    registry.make_checkpoint('pi0fast-tiny', folder + '/ck', seed=0)
    policy = VLAPolicy.from_pretrained(folder + '/ck')
    size = policy.model_config.image_size
    result = policy.predict(np.zeros((size, size, 3), np.uint8), 'open the drawer')
    results['pi0fast-tiny'] = list(np.shape(result.action))
loaded = sorted(m for m in ABSENT if m in sys.modules and m not in present)
print(json.dumps({'results': results, 'loaded_absent': loaded}))
'''


def install_requires() -> list[str]:
    """setup.py's install_requires, read from its source (the list literal)."""
    tree = ast.parse((ROOT / 'setup.py').read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == 'install_requires':
            return ast.literal_eval(node.value)
    raise AssertionError('setup.py has no install_requires')


def canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def requirement_closure(requirements) -> set[str]:
    """The distributions ``requirements`` pull in, transitively (markers evaluated here, with
    the extras each requirement asks for); a requirement not installed is skipped."""
    seen: set[str] = set()
    todo = [(r, frozenset()) for r in requirements]
    while todo:
        text, _ = todo.pop()
        req = packaging_requirements.Requirement(text)
        name = canonical(req.name)
        if name in seen:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for sub in dist.requires or []:
            parsed = packaging_requirements.Requirement(sub)
            environments = [{'extra': e} for e in ('', *req.extras)]
            if parsed.marker is None or any(parsed.marker.evaluate(env)
                                            for env in environments):
                todo.append((sub, frozenset()))
    return seen


def absent_modules(closure: set[str]) -> set[str]:
    """Top-level modules provided only by installed distributions outside ``closure``."""
    absent = set()
    for module, dists in metadata.packages_distributions().items():
        names = {canonical(d) for d in dists}
        if not names & (closure | {canonical(PACKAGE)}) and module.isidentifier():
            absent.add(module)
    return absent


def test_setup_py_requires_no_extra_for_the_fast_codec():
    assert not any(canonical(packaging_requirements.Requirement(r).name) == 'scipy'
                   for r in install_requires()), 'the FAST codec needs no scipy (codecs/dct.py)'


def test_every_family_loads_and_predicts_with_only_install_requires():
    closure = requirement_closure(install_requires())
    absent = absent_modules(closure)
    assert 'torch' not in absent and 'numpy' not in absent
    if 'scipy' in metadata.packages_distributions():
        assert 'scipy' in absent          # installed here (test extra), absent in the child
    run = subprocess.run([sys.executable, '-c', CHILD, json.dumps(sorted(absent))],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report['results'] == {'metaworld-demo-fast': [8, 7], 'metaworld-demo': [7],
                                 'pi0fast-tiny': [4, 3]}
    assert report['loaded_absent'] == []
