"""A user's own model or loss by import path: ``package.module:name`` or ``file.py:name``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from hethpc.models.errors import ImportSpecError


def import_object(spec: str, *, what: str = "object") -> Any:
    """The object ``spec`` names: ``package.module:attr`` (importable) or ``path/file.py:attr``.

    A file path is loaded as a module of its own name; its directory is not added to
    ``sys.path``. The module's code runs: name only code you trust, as with any import.

    Args:
        spec: ``module:attr``; ``attr`` may be dotted (``module:Class.create``).
        what: what the object is for, in messages (``model factory``, ``loss``).

    Raises:
        ImportSpecError: the form is wrong, or the module or attribute cannot be found.
    """
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ImportSpecError(
            f"{what} {spec!r} must look like 'package.module:name' or 'path/to/file.py:name'"
        )
    try:
        if module_part.endswith(".py"):
            path = Path(module_part)
            if not path.is_file():
                raise ImportSpecError(f"{what} {spec!r}: there is no file {path}")
            name = f"hethpc_user_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_part)
    except ImportError as e:
        raise ImportSpecError(
            f"{what} {spec!r}: cannot import {module_part} ({e}); check the name, or that its "
            "package is installed or on PYTHONPATH"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportSpecError(f"{what} {spec!r}: {module_part} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
