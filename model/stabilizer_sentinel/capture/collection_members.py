"""Which tensors a collection holds: the names capture gives a network's tensors, and how a
collection's ``include_regex`` selects among them. Built-in collections and the tensor names they hold:

==============  ======================================================================
collection      tensors
==============  ======================================================================
``weights``     ``weights/<parameter>`` for every parameter whose name does not end in ``bias``
``biases``      ``biases/<parameter>`` for every parameter whose name ends in ``bias``
``gradients``   ``gradients/<parameter>`` for every parameter with a gradient
``losses``      ``losses/loss`` (TRAIN: the batch loss; EVAL: the mean loss of the evaluation)
``activations`` ``activations/<module>``: outputs of the network's blocks (modules whose class
                name ends in ``Block``), or of the modules its ``include_regex`` names
``activation_outputs`` ``activations/<module>`` for activation-function modules (ReLU, ELU, ...)
``activation_inputs`` ``activation_inputs/<module>``: what those modules received
``inputs``      ``inputs/inputs`` (the input batch)
``labels``      ``labels/labels`` (class indices)
``predictions`` ``predictions/predictions`` (arg-max class indices)
==============  ======================================================================

Any other name is a custom collection selected by ``include_regex`` over all of the names above and
their smdebug names (``<module>_output_0``, ``<Loss>_input_0``, ...), where ``activations/<module>`` and
``activation_inputs/<module>`` exist for every named module (searched anywhere in the name, as Debugger
does). A collection whose regex matches nothing fails the job after its first step (the loss module is
known then), naming it with sample names in both forms: Debugger leaves it empty and silent.

Names only: nothing here hooks a module or copies a tensor; that is ``stabilizer_sentinel.capture.capture``'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from torch import nn

from stabilizer_sentinel.capture.collection_config import BUILTIN_COLLECTIONS, CollectionConfig
from stabilizer_sentinel.capture.trial import matches

ACTIVATION_TYPES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid)


def builtin_names(parameters: Iterable[str], modules: Mapping[str, nn.Module]) -> dict[str, list[str]]:
    """Each built-in collection's tensor names for a network, from its parameters' and named modules' names."""
    parameters = list(parameters)
    names = {
        "weights": [f"weights/{n}" for n in parameters if not n.endswith("bias")],
        "biases": [f"biases/{n}" for n in parameters if n.endswith("bias")],
        "gradients": [f"gradients/{n}" for n in parameters],
        "losses": ["losses/loss"],
        "inputs": ["inputs/inputs"],
        "labels": ["labels/labels"],
        "predictions": ["predictions/predictions"],
    }
    # Inputs of activation-function modules (SaturatedActivation, PoorWeightInitialization).
    names["activation_inputs"] = [f"activation_inputs/{n}" for n, m in modules.items()
                                  if isinstance(m, ACTIVATION_TYPES)]
    names["activation_outputs"] = [f"activations/{n}" for n, m in modules.items()
                                   if isinstance(m, ACTIVATION_TYPES)]
    names["activations"] = [f"activations/{n}" for n, m in modules.items()
                            if type(m).__name__.endswith("Block")]
    return names


def selectable_names(builtin: Mapping[str, list[str]], modules: Iterable[str]) -> list[str]:
    """Every name a custom collection selects from: all built-in tensors, every named module's output and input."""
    modules = list(modules)
    names = [n for key, names in builtin.items() if not key.startswith("activation") for n in names]
    return names + [f"activations/{n}" for n in modules] + [f"activation_inputs/{n}" for n in modules]


def select_members(
    name: str,
    config: CollectionConfig,
    builtin: Mapping[str, list[str]],
    selectable: list[str],
    alias: Callable[[str], str | None],
) -> tuple[str, ...]:
    """A collection's tensors: custom ones by name or smdebug's name (``alias``; re.search, as
    smdebug's ``match_inc``)."""
    patterns = [re.compile(regex) for regex in config.include_regex]
    if name in BUILTIN_COLLECTIONS and not patterns:
        members = builtin[name]
    elif name in ("activations", "activation_outputs"):
        members = [n for n in selectable if n.startswith("activations/") and matches(n, patterns, alias(n))]
    elif name in BUILTIN_COLLECTIONS:
        members = [n for n in builtin[name] if matches(n, patterns, alias(n))]
    else:
        members = [n for n in selectable if matches(n, patterns, alias(n))]
    return tuple(members)


def sample_names(selectable: list[str], modules: Sequence[str]) -> list[str]:
    """A few names to show beside a regex that matched nothing: the first of each kind, and the
    last module's output."""
    firsts: dict[str, str] = {}
    for each in selectable:
        firsts.setdefault(each.partition("/")[0], each)
    return list(dict.fromkeys([*firsts.values(), *[f"activations/{n}" for n in list(modules)[-1:]]]))
