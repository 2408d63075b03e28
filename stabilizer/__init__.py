"""stabilizer: detect exploding, vanishing and stalled training runs, stop them, and relaunch.

This package holds the CLI, the local engine (the project's ASL file and Lambda code run on one
machine), and the client notebooks use. The deployed parts live in infra/, lambdas/,
statemachine/ and model/.
"""

__version__ = "0.1.0"
