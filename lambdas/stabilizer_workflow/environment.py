"""The Lambda functions' environment variables: each name written once (docs/contracts.md, section 4).

The functions read them (stabilizer_workflow.settings, through the maps below); the CDK app sets
them on the deployed functions (infra/workflow.py, infra/image_mapping.py) and local mode on its
in-process ones (stabilizer.local.engine.deployment, stabilizer.training_images). Standard library only:
the CDK app and local mode import this module without the functions' dependencies.
"""

from __future__ import annotations

BUCKET = "BUCKET"
TOPIC_ARN = "TOPIC_ARN"
JOB_NAME_PREFIX = "JOB_NAME_PREFIX"
SAGEMAKER_ROLE_ARN = "SAGEMAKER_ROLE_ARN"
TRAINING_IMAGE_URI = "TRAINING_IMAGE_URI"
TRAINING_IMAGE_URI_GPU = "TRAINING_IMAGE_URI_GPU"
FRAMEWORK_IMAGES = "FRAMEWORK_IMAGES"
DEBUGGER_RULE_IMAGE = "DEBUGGER_RULE_IMAGE"
SOURCE_S3_URI = "SOURCE_S3_URI"
TRAIN_DATA_S3_URI = "TRAIN_DATA_S3_URI"
TEST_DATA_S3_URI = "TEST_DATA_S3_URI"
LIBRARY_S3_URI = "LIBRARY_S3_URI"
DEFAULT_INSTANCE_TYPE = "DEFAULT_INSTANCE_TYPE"
DEBUGGER_RULES_ENABLED = "DEBUGGER_RULES_ENABLED"
WARM_POOL_SECONDS = "WARM_POOL_SECONDS"
DATA_BUCKETS = "DATA_BUCKETS"
METRIC_PERIOD_SECONDS = "METRIC_PERIOD_SECONDS"
# Set by the Lambda runtime itself, never by a deployment.
AWS_REGION = "AWS_REGION"
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
# Read by Powertools (stabilizer_workflow.telemetry), not by the settings.
POWERTOOLS_SERVICE_NAME = "POWERTOOLS_SERVICE_NAME"

# What each function's settings read: settings field -> variable.
MONITOR = {"topic_arn": TOPIC_ARN, "metric_period_seconds": METRIC_PERIOD_SECONDS}
WATCH = {"bucket": BUCKET, "topic_arn": TOPIC_ARN, "job_name_prefix": JOB_NAME_PREFIX}
TRAIN = {
    "bucket": BUCKET,
    "topic_arn": TOPIC_ARN,
    "sagemaker_role_arn": SAGEMAKER_ROLE_ARN,
    "training_image_uri": TRAINING_IMAGE_URI,
    "training_image_uri_gpu": TRAINING_IMAGE_URI_GPU,
    "framework_images": FRAMEWORK_IMAGES,
    "debugger_rule_image": DEBUGGER_RULE_IMAGE,
    "source_s3_uri": SOURCE_S3_URI,
    "train_data_s3_uri": TRAIN_DATA_S3_URI,
    "test_data_s3_uri": TEST_DATA_S3_URI,
    "job_name_prefix": JOB_NAME_PREFIX,
    "default_instance_type": DEFAULT_INSTANCE_TYPE,
    "debugger_rules_enabled": DEBUGGER_RULES_ENABLED,
    "warm_pool_seconds": WARM_POOL_SECONDS,
    "region": AWS_REGION,
    "library_s3_uri": LIBRARY_S3_URI,
    "data_buckets": DATA_BUCKETS,
}
FUNCTIONS = {"monitor": MONITOR, "watch": WATCH, "train": TRAIN}

# What a deployment may leave unset: the function then uses its default (the metric period of
# SageMaker's streams, no other data bucket, no Debugger rule image when Debugger's rules are off,
# one image for every instance type when the deployment names its own).
OPTIONAL = frozenset({METRIC_PERIOD_SECONDS, DATA_BUCKETS, DEBUGGER_RULE_IMAGE, TRAINING_IMAGE_URI_GPU})
# Where the Lambda runtime's variable is missing (an older runtime, a test), this one is read.
FALLBACKS = {AWS_REGION: AWS_DEFAULT_REGION}


def deployed(function: str) -> frozenset[str]:
    """The variables a deployment sets on `function`: what its settings read, less the runtime's own
    and the optional ones, and Powertools' service name."""
    return frozenset(FUNCTIONS[function].values()) - OPTIONAL - {AWS_REGION} | {POWERTOOLS_SERVICE_NAME}
