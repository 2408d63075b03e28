"""Local mode: the project's state machine, Lambda code and training jobs run on one machine, with
local stand-ins for S3, SNS, SQS, SageMaker and IAM (the engine, the emulators, the staging)."""
