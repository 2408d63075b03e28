"""Local mode's SageMaker emulator: each training job a real process on this machine.

``sagemaker``         ``LocalSageMaker``: the training-job API (create, describe, stop, list)
``training_job``      one job's life: statuses, stops, timings, one process group per instance
``container``         the training container contract: ``/opt/ml``, channels, ``SM_*``, checkpoints
``runners``           how the container starts the entry point on each host
``rule_jobs``         Debugger's rule jobs as evaluator processes
``s3files``           channels and checkpoints copied between the local S3 and disk
``validation``        a request checked against botocore's service model
``job_state_events``  the "Training Job State Change" event SageMaker sends to EventBridge

It knows nothing of the state machine: it imports neither the engine nor the access check.
"""
