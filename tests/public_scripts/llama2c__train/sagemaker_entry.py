"""The job's entry point for llama2.c's train.py:
SageMaker passes hyperparameters as `--name value`, and llama2.c's configurator asserts `--name=value`
(`--max_iters=100`), so this rewrites the arguments and runs the unchanged upstream script with `runpy`,
in this process, as `__main__`. Same process, same working directory, same output.
"""

import runpy
import sys

SCRIPT = "train.py"


def equals_arguments(arguments: list[str]) -> list[str]:
    """`--name value` pairs as `--name=value`; an argument already written `--name=value` stays as it is."""
    rewritten, index = [], 0
    while index < len(arguments):
        argument = arguments[index]
        if "=" not in argument and index + 1 < len(arguments) and not arguments[index + 1].startswith("--"):
            rewritten.append(f"{argument}={arguments[index + 1]}")
            index += 2
        else:
            rewritten.append(argument)
            index += 1
    return rewritten


if __name__ == "__main__":
    sys.argv = [SCRIPT, *equals_arguments(sys.argv[1:])]
    runpy.run_path(SCRIPT, run_name="__main__")
