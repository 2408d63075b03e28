"""Local mode's engine: the state machine run by moto's interpreter, the Lambdas in process.

``engine``              ``LocalEngine``: stands the deployment up, starts and stops executions
``deployment``          ``Project``, ``LocalSettings``: the settings CDK bakes in, the placeholders' local values
``lambda_seam``         the interpreter's Lambda invocations routed to the handler functions
``history_events``      the interpreter's history kept in GetExecutionHistory's shape
``execution_follower``  follows one execution into a RunRecord
``staging``             a job of your own: its local paths checked and uploaded to the local S3

It stands on the SageMaker emulator (``stabilizer.local.emulator``) and the IAM access check
(``stabilizer.local.iam``); neither imports it.
"""
