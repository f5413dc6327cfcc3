"""The shape the style asks of the engine and the node (docs/architecture.md; STYLE.md): no
function in `vla_spec_ros/engine/` or `vla_spec_ros/ros/` over MAX_FUNCTION_LINES lines, and no
import circle among their modules.

A function's length is its `def` line to its last line, docstring and comments included
(decorators not); a nested function counts on its own and inside its parent. Imports are read
as test_import_graph.py reads them (function-level and relative ones included). Pure Python:
nothing is imported.
"""
import ast
from pathlib import Path

from test_import_graph import PACKAGE_ROOT, _imports, _module_name

MAX_FUNCTION_LINES = 60
CHECKED_LAYERS = ('engine', 'ros')


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES, filename: str = '<source>'):
    """[(qualified name, first line, number of lines)] of the functions longer than `limit`."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f'{prefix}{child.name}'
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > limit:
                        found.append((name, child.lineno, length))
                visit(child, name + '.')
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), '')
    return found


def _checked_files():
    return [path for layer in CHECKED_LAYERS
            for path in sorted((PACKAGE_ROOT / layer).rglob('*.py'))]


def _function(name: str, num_lines: int, indent: str = '', keyword: str = 'def') -> str:
    """The source of a function of exactly `num_lines` lines."""
    body = [f'{indent}    x{i} = {i}' for i in range(num_lines - 1)]
    return '\n'.join([f'{indent}{keyword} {name}():'] + body)


def test_the_length_check_sees_methods_nested_and_async_functions():
    limit = MAX_FUNCTION_LINES
    source = '\n\n'.join([
        _function('fits', limit),
        'class A:\n' + _function('step', limit + 1, '    ', keyword='async def'),
        'def outer():\n' + _function('inner', limit + 1, '    ') + '\n    return inner',
        'if True:\n' + _function('conditional', limit + 1, '    '),
    ])
    found = {name: length for name, _, length in long_functions(source)}
    assert found == {'A.step': limit + 1, 'outer': limit + 3, 'outer.inner': limit + 1,
                     'conditional': limit + 1}


def test_no_function_in_engine_or_ros_is_over_60_lines():
    files = _checked_files()
    assert len(files) > 20, files                 # the layers were found
    offenders = [f'{path.relative_to(PACKAGE_ROOT.parent)}:{line} {name} ({length} lines)'
                 for path in files
                 for name, line, length in long_functions(path.read_text(), filename=str(path))]
    assert not offenders, (f'functions over {MAX_FUNCTION_LINES} lines (cut them into named '
                           f'steps): {offenders}')


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                connect(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return found


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
    assert _cycles({'a': {'b'}, 'b': set()}) == []


def test_no_import_circle_in_engine_or_ros():
    modules = {_module_name(path): path for path in _checked_files()}
    graph = {name: {imported for imported in _imports(path)
                    if imported in modules and imported != name}
             for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_checked_layers_exist():
    for layer in CHECKED_LAYERS:
        assert (Path(PACKAGE_ROOT) / layer / '__init__.py').is_file()
