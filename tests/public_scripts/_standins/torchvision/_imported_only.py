"""Names that a library imports from torchvision at its own import (torchmetrics, wherever a torchvision
imports) and that no vendored script calls: each raises NotImplementedError, naming itself, when called."""

from collections.abc import Callable
from typing import Any


def not_here(name: str) -> Callable[..., Any]:
    def called(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the torchvision stand-in has no {name}: no vendored script calls it")

    called.__name__ = called.__qualname__ = name.rsplit(".", 1)[-1]
    return called
