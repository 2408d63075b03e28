"""stabilizer: detect exploding, vanishing and stalled training runs, stop them, and relaunch.

This package holds the command line (``cli``), the client and SDK adaptation (``client``), local
mode (``local``: the project's ASL file and Lambda code run on one machine), reports and plots
(``reports``) and the benchmarks (``bench``). The deployed parts are the packages
``stabilizer_workflow`` (lambdas/), ``stabilizer_sentinel`` and ``stabilizer_contract`` (model/),
with infra/ and statemachine/.
"""

__version__ = "0.1.0"
