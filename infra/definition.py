"""The state machine definition and its placeholder map, as CDK reads them.

`statemachine/stabilizer.asl.json` is the single source of truth of the workflow; its `${Name}`
placeholders are listed with the deployment value each stands for in
`statemachine/placeholders.json`, which the local engine reads too. This module checks that the
two agree and turns the map into CDK `definition_substitutions`. It must not create constructs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFINITION_FILE = REPO_ROOT / "statemachine" / "stabilizer.asl.json"
PLACEHOLDER_FILE = REPO_ROOT / "statemachine" / "placeholders.json"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def placeholder_map(path: Path = PLACEHOLDER_FILE) -> dict[str, str]:
    """Placeholder name -> the value key it stands for (`TrainFunctionArn` -> `train_function_arn`)."""
    return dict(json.loads(path.read_text())["placeholders"])


def substitutions(values: Mapping[str, object], definition: str | None = None) -> dict[str, object]:
    """`definition_substitutions` for `definition`: each placeholder filled from `values` by its key.

    Raises ValueError naming what is missing: a placeholder the map does not list, or a key with no
    value. A key the map lists but the definition does not use is dropped (CDK would reject it).
    """
    text = DEFINITION_FILE.read_text() if definition is None else definition
    mapping = placeholder_map()
    used = set(PLACEHOLDER.findall(text))
    unmapped = sorted(used - set(mapping))
    if unmapped:
        raise ValueError(f"{PLACEHOLDER_FILE.name} does not list the placeholder(s) {', '.join(unmapped)}")
    missing = sorted(mapping[name] for name in used if mapping[name] not in values)
    if missing:
        raise ValueError(f"no value for {', '.join(missing)}")
    return {name: values[mapping[name]] for name in sorted(used)}
