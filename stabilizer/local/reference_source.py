"""Modules of the reference training source (``model/``), loaded from their files.

``model/`` is a SageMaker source directory, not a package: in the job its files import each other
as siblings (``from data import read_channel``). Outside the job, a benchmark that trains the
reference network in process loads the file it needs by path, under a name of its own, so no
directory goes on ``sys.path`` and no generic top-level name (``data``, ``resnet``) is taken.
Only files that import no sibling can be loaded this way (``data.py``, ``resnet.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from stabilizer.local.checkout import reference_source


def reference_module(name: str, model_dir: Path | None = None) -> ModuleType:
    """``model/<name>.py`` as a module named ``stabilizer_reference_source_<name>`` (loaded once)."""
    key = f"stabilizer_reference_source_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = (model_dir or reference_source()) / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"the reference training source has no {path.name} in {path.parent}")
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
