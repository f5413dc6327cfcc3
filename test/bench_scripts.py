"""Shared by the tests of bench/ scripts: load one as a module (bench/ is not a package)."""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / 'bench'


def load_bench(name: str):
    """bench/<name>.py, executed as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
