"""stabilizer: detect exploding, vanishing and stalled training runs, stop them, and relaunch.

This package holds the command line (``cli``), the client and SDK adaptation (``client``), local
mode (``local``: the project's ASL file and Lambda code run on one machine), source packing
(``source``), reports and plots (``reports``) and the benchmarks (``bench``). The deployed parts
are the packages ``stabilizer_workflow`` (lambdas/), ``stabilizer_sentinel`` and
``stabilizer_contract`` (model/), with infra/ and statemachine/.

Imports point down, never up: ``cli`` and ``bench`` over ``client``, over ``local``, over the floor
that all of them and the CDK app (infra/) share: ``source``, ``reports``, ``mailbox`` and
``training_images``. tests/packaging/test_import_direction.py holds the rules.
"""

__version__ = "0.1.0"
