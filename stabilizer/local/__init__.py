"""Local mode: the project's state machine, Lambda code and training jobs run on one machine, with
local stand-ins for S3, SNS, SQS, SageMaker and IAM.

``engine/``       the engine: moto's Step Functions interpreter running the ASL, the Lambdas in
                  process, the deployment's local settings, a job's staging, following an execution
``emulator/``     the SageMaker emulator: training jobs (and Debugger's rule jobs) as local processes
``iam/``          the IAM access check: every call judged by the synthesized stack's policies (strict mode)
``checkout``      where the project's parts are (a checkout or an installed wheel)
``offline_digits``, ``reference_source``  the offline data set and the reference source's modules

Imports point one way: the engine stands on the emulator and the access check, which stand on
this package's own modules and never on each other or the engine
(tests/packaging/test_import_direction.py).
"""
