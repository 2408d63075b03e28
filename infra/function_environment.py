"""What each Lambda function's environment holds: what its settings read, and no more.

The names have one home, the functions' own ``stabilizer_workflow.environment`` (docs/contracts.md,
section 4); the values come from the deployment's configuration, its storage and its training runtime.
"""

from __future__ import annotations

from infra.config import DeploymentConfig
from infra.storage import Storage
from infra.training_runtime import TrainingRuntime
from stabilizer_workflow import environment as env


def function_environments(
    config: DeploymentConfig, storage: Storage, runtime: TrainingRuntime
) -> dict[str, dict[str, str]]:
    """``{"monitor": ..., "watch": ..., "train": ...}``: each function's variables."""
    monitor = {env.TOPIC_ARN: storage.topic.topic_arn, env.POWERTOOLS_SERVICE_NAME: "stabilizer"}
    watch = {**monitor, env.BUCKET: storage.bucket.bucket_name, env.JOB_NAME_PREFIX: config.job_name_prefix}
    train = {
        **watch,
        env.SAGEMAKER_ROLE_ARN: runtime.execution_role.role_arn,
        **runtime.images.environment,
        env.SOURCE_S3_URI: storage.source_s3_uri,
        env.LIBRARY_S3_URI: storage.library_s3_uri,
        env.TRAIN_DATA_S3_URI: storage.data_uri("train"),
        env.TEST_DATA_S3_URI: storage.data_uri("test"),
        env.DEFAULT_INSTANCE_TYPE: config.instance_type,
        env.DEBUGGER_RULES_ENABLED: "true" if config.debugger_rules_enabled else "false",
        env.WARM_POOL_SECONDS: str(config.warm_pool_seconds),
        **({env.DATA_BUCKETS: ",".join(config.data_buckets)} if config.data_buckets else {}),
    }
    return {"monitor": monitor, "watch": watch, "train": train}
