"""Which of the `--params-file`s a node was started with name it at all.

rcl applies a parameter file's section only to the nodes its key matches (`/**`, `vla_spec`,
`/arm/vla_spec`, `/**/vla_spec`, ...), silently: a file whose keys name another node (a
renamed node, a typo, the example's `vla_spec` under `node_name:=vla_left`) leaves every
parameter at its default, and the node loads its default model. The node says so instead.
"""
from __future__ import annotations

import re


def params_files(argv) -> list[str]:
    """The files given to `--params-file` after `--ros-args` in `argv`."""
    argv = list(argv or ())
    if '--ros-args' not in argv:
        return []
    ros = argv[argv.index('--ros-args') + 1:]
    return [ros[i + 1] for i, arg in enumerate(ros[:-1]) if arg == '--params-file']


def key_matches(key: str, fully_qualified_name: str) -> bool:
    """Whether a parameter file's node key applies to the node `fully_qualified_name`
    (`/ns/name`): `**` any namespaces, `*` one name token, no leading slash = from the root."""
    segments = [part for part in str(key).split('/') if part]
    regex = ''.join('(?:/[^/]+)*' if part == '**' else '/[^/]*' if part == '*'
                    else '/' + re.escape(part) for part in segments)
    return re.fullmatch(regex, fully_qualified_name) is not None


def unmatched_params_files(argv, fully_qualified_name: str) -> list[tuple[str, list]]:
    """(file, its node keys) of each params file none of whose keys names this node; files
    that cannot be read are left to rcl, which refuses them at start-up."""
    import yaml

    unmatched = []
    for path in params_files(argv):
        try:
            with open(path, encoding='utf-8') as handle:
                document = yaml.safe_load(handle) or {}
        except (OSError, ValueError, yaml.YAMLError):
            continue
        keys = list(document) if isinstance(document, dict) else []
        if keys and not any(key_matches(key, fully_qualified_name) for key in keys):
            unmatched.append((path, keys))
    return unmatched


__all__ = ['params_files', 'key_matches', 'unmatched_params_files']
