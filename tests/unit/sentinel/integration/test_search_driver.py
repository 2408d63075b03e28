"""Which package calls the training under way: a search's first trial is told, never acted on (``search_driver``)."""

from __future__ import annotations

from stabilizer_sentinel.integration.launcher_hooks import search_driver


def called_from(module: str) -> str | None:
    """``search_driver`` called by a function of ``module`` (as a package's code calls a fit)."""
    space = {"__name__": module, "inner": search_driver}
    exec("def outer():\n    return inner()\n", space)
    return space["outer"]()


def test_a_search_packages_frame_on_the_stack_names_the_package():
    assert called_from("sklearn.model_selection._validation") == "sklearn.model_selection"
    assert called_from("optuna.study._optimize") == "optuna"
    assert called_from("ray.tune.trainable.function_trainable") == "ray.tune"


def test_a_scripts_own_loop_and_a_packages_other_modules_name_none():
    assert search_driver() is None
    assert called_from("__main__") is None
    assert called_from("sklearn.linear_model._base") is None  # scikit-learn, but no search
    assert called_from("optunaish") is None
