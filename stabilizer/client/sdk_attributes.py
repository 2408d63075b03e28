"""How an SDK object's attributes read: whether one is set at all, and whether a location is in S3.

sagemaker-core shapes (ModelTrainer's ``source_code``, ``compute``, ``stopping_condition``, ...)
mark an unset field with an ``Unassigned`` object instead of None, so stabilizer.client.sdk and
stabilizer.client.sdk_source ask `given` before they read one. Reads values only.
"""

from __future__ import annotations

from typing import Any


def given(value: Any) -> bool:
    """sagemaker-core shapes mark unset fields with an `Unassigned` object instead of None."""
    return value is not None and type(value).__name__ != "Unassigned"


def is_s3(value: Any) -> bool:
    """A location already in S3 (an ``s3://`` URI): used as it is, never packed or uploaded."""
    return isinstance(value, str) and value.startswith("s3://")
