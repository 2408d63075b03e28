"""What IAM is asked when a principal makes an AWS call: action, resource ARN and context keys.

One API call can be several authorization requests: CreateTrainingJob is `sagemaker:
CreateTrainingJob` on the job, `sagemaker:AddTags` on the job when the request has Tags, and
`iam:PassRole` on its RoleArn with `iam:PassedToService`. What a training job then does as its
execution role, which no API call of ours shows (pulling the image, writing Debugger's and the
profiler's output), is `job_requests()`.

Sources, per service (the Service Authorization Reference, "Actions, resources, and condition
keys for ..." pages, gives each action's resource type and condition keys):
- S3: ListObjects(V2) is `s3:ListBucket` on the bucket, with `s3:prefix` (the request's Prefix),
  `s3:delimiter` and `s3:max-keys` as condition keys (S3 API Reference, ListObjectsV2,
  "Permissions": "You must have permission to perform the s3:ListBucket action"). HeadObject is
  `s3:GetObject` (S3 API Reference, HeadObject, "Permissions"). Multipart uploads are
  `s3:PutObject`, an abort `s3:AbortMultipartUpload`.
- SageMaker: a training job's ARN is `arn:aws:sagemaker:<region>:<account>:training-job/<name>`
  with the name lower-cased. Creating it with Tags also needs `sagemaker:AddTags` (the error of
  aws/aws-cdk#32294: "not authorized to perform: sagemaker:AddTags on resource:
  arn:aws:sagemaker:...:training-job/... because no identity-based policy allows the
  sagemaker:AddTags action"). ListTrainingJobs supports no resource type (`*`).
- Step Functions: the request of SendTaskSuccess names no ARN (only the token), so it is judged
  against the state machine that issued the token, the resource CDK's `grantTaskResponse` scopes
  it to (the stack's watch grant does the same); an assumption, not checked against AWS here.

An operation not listed here is returned as `<service>:<Operation>` on `*`, marked `mapped=False`,
so a new call shows up (and a test can refuse it) instead of passing unexamined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stabilizer_contract.s3_uris import split_s3_uri


@dataclass(frozen=True)
class IamRequest:
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)
    mapped: bool = True


@dataclass(frozen=True)
class Where:
    """The deployment facts a request's ARN needs."""

    region: str = "us-east-1"
    account: str = "123456789012"
    partition: str = "aws"
    state_machine_arn: str = ""


def _s3_bucket(params: dict[str, Any], w: Where) -> str:
    return f"arn:{w.partition}:s3:::{params['Bucket']}"


def _s3_object(params: dict[str, Any], w: Where, key: str | None = None) -> str:
    return f"arn:{w.partition}:s3:::{params['Bucket']}/{key if key is not None else params['Key']}"


def _list_bucket(params: dict[str, Any], w: Where) -> list[IamRequest]:
    context = {}
    for parameter, key in (("Prefix", "s3:prefix"), ("Delimiter", "s3:delimiter"), ("MaxKeys", "s3:max-keys")):
        if parameter in params:
            context[key] = str(params[parameter])
    return [IamRequest("s3:ListBucket", _s3_bucket(params, w), context)]


def _object_action(action: str) -> Callable[[dict[str, Any], Where], list[IamRequest]]:
    return lambda params, w: [IamRequest(action, _s3_object(params, w))]


def _delete_objects(params: dict[str, Any], w: Where) -> list[IamRequest]:
    keys = [item["Key"] for item in params.get("Delete", {}).get("Objects", [])]
    return [IamRequest("s3:DeleteObject", _s3_object(params, w, key)) for key in keys]


def _copy_object(params: dict[str, Any], w: Where) -> list[IamRequest]:
    source = params["CopySource"]
    if isinstance(source, dict):
        source_arn = f"arn:{w.partition}:s3:::{source['Bucket']}/{source['Key']}"
    else:
        source_arn = f"arn:{w.partition}:s3:::{str(source).lstrip('/')}"
    return [IamRequest("s3:GetObject", source_arn), IamRequest("s3:PutObject", _s3_object(params, w))]


def sagemaker_arn(kind: str, name: str, w: Where) -> str:
    return f"arn:{w.partition}:sagemaker:{w.region}:{w.account}:{kind}/{name.lower()}"


def _create_training_job(params: dict[str, Any], w: Where) -> list[IamRequest]:
    job = sagemaker_arn("training-job", params["TrainingJobName"], w)
    requests = [IamRequest("sagemaker:CreateTrainingJob", job)]
    if params.get("Tags"):
        requests.append(IamRequest("sagemaker:AddTags", job))
    requests.append(
        IamRequest("iam:PassRole", params["RoleArn"], {"iam:PassedToService": "sagemaker.amazonaws.com"})
    )
    return requests


def _training_job(action: str) -> Callable[[dict[str, Any], Where], list[IamRequest]]:
    return lambda params, w: [IamRequest(action, sagemaker_arn("training-job", params["TrainingJobName"], w))]


def _task_response(action: str) -> Callable[[dict[str, Any], Where], list[IamRequest]]:
    return lambda params, w: [IamRequest(action, w.state_machine_arn)]


def _function_arn(name: str, w: Where) -> str:
    if name.startswith("arn:"):
        return name
    return f"arn:{w.partition}:lambda:{w.region}:{w.account}:function:{name}"


_OPERATIONS: dict[tuple[str, str], Callable[[dict[str, Any], Where], list[IamRequest]]] = {
    ("s3", "ListObjectsV2"): _list_bucket,
    ("s3", "ListObjects"): _list_bucket,
    ("s3", "GetObject"): _object_action("s3:GetObject"),
    ("s3", "HeadObject"): _object_action("s3:GetObject"),
    ("s3", "PutObject"): _object_action("s3:PutObject"),
    ("s3", "CreateMultipartUpload"): _object_action("s3:PutObject"),
    ("s3", "UploadPart"): _object_action("s3:PutObject"),
    ("s3", "CompleteMultipartUpload"): _object_action("s3:PutObject"),
    ("s3", "AbortMultipartUpload"): _object_action("s3:AbortMultipartUpload"),
    ("s3", "DeleteObject"): _object_action("s3:DeleteObject"),
    ("s3", "DeleteObjects"): _delete_objects,
    ("s3", "CopyObject"): _copy_object,
    ("sagemaker", "CreateTrainingJob"): _create_training_job,
    ("sagemaker", "DescribeTrainingJob"): _training_job("sagemaker:DescribeTrainingJob"),
    ("sagemaker", "StopTrainingJob"): _training_job("sagemaker:StopTrainingJob"),
    ("sagemaker", "UpdateTrainingJob"): _training_job("sagemaker:UpdateTrainingJob"),
    ("sagemaker", "ListTrainingJobs"): lambda params, w: [IamRequest("sagemaker:ListTrainingJobs", "*")],
    ("sagemaker", "StopProcessingJob"): lambda params, w: [
        IamRequest("sagemaker:StopProcessingJob", sagemaker_arn("processing-job", params["ProcessingJobName"], w))
    ],
    # CloudWatch's GetMetricData has no resource type: it is asked on `*`.
    ("cloudwatch", "GetMetricData"): lambda params, w: [IamRequest("cloudwatch:GetMetricData", "*")],
    ("sns", "Publish"): lambda params, w: [IamRequest("sns:Publish", params.get("TopicArn") or params["TargetArn"])],
    ("stepfunctions", "SendTaskSuccess"): _task_response("states:SendTaskSuccess"),
    ("stepfunctions", "SendTaskFailure"): _task_response("states:SendTaskFailure"),
    ("stepfunctions", "SendTaskHeartbeat"): _task_response("states:SendTaskHeartbeat"),
    ("stepfunctions", "DescribeExecution"): lambda params, w: [
        IamRequest("states:DescribeExecution", params["executionArn"])
    ],
    ("lambda", "Invoke"): lambda params, w: [
        IamRequest("lambda:InvokeFunction", _function_arn(params["FunctionName"], w))
    ],
}


def requests_for(service: str, operation: str, params: dict[str, Any], where: Where) -> list[IamRequest]:
    """The authorization requests of one call (`service` is botocore's service name: s3, stepfunctions, ...)."""
    build = _OPERATIONS.get((service, operation))
    if build is None:
        prefix = "states" if service == "stepfunctions" else service
        return [IamRequest(f"{prefix}:{operation}", "*", mapped=False)]
    return build(params, where)


def _ecr_repository_arn(image: str, w: Where) -> str | None:
    host, _, path = image.partition("/")
    parts = host.split(".")
    if len(parts) < 4 or parts[1:3] != ["dkr", "ecr"]:
        return None
    repository = path.split("@")[0].split(":")[0]
    return f"arn:{w.partition}:ecr:{parts[3]}:{parts[0]}:repository/{repository}"


def _output_object(uri: str, job_name: str, w: Where, leaf: str) -> str:
    bucket, prefix = split_s3_uri(uri)
    prefix = prefix.rstrip("/")
    return f"arn:{w.partition}:s3:::{bucket}/{prefix + '/' if prefix else ''}{job_name}/{leaf}"


def job_requests(request: dict[str, Any], where: Where) -> list[IamRequest]:
    """What SageMaker does as the job's execution role that no API call of ours shows.

    Pulling the training image (ECR's three layer actions on its repository, and
    GetAuthorizationToken on `*`), and writing Debugger's tensors and the profiler's output under
    their S3 output paths (SageMaker writes under `<S3OutputPath>/<job name>/`). Reading the
    channels, the source and the checkpoints, and writing the model and checkpoints, are calls
    the local training job really makes, so they are recorded as they happen.
    """
    name = request["TrainingJobName"]
    found = []
    repository = _ecr_repository_arn(request["AlgorithmSpecification"]["TrainingImage"], where)
    if repository is None:
        found.append(IamRequest("ecr:BatchGetImage", f"not-ecr:{request['AlgorithmSpecification']['TrainingImage']}"))
    else:
        found += [IamRequest(action, repository) for action in (
            "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability")]
    found.append(IamRequest("ecr:GetAuthorizationToken", "*"))
    for section, leaf in (("DebugHookConfig", "debug-output/collections/000000000/tensors.json"),
                          ("ProfilerConfig", "profiler-output/system/incremental/metrics.json")):
        path = request.get(section, {}).get("S3OutputPath")
        if path:
            found.append(IamRequest("s3:PutObject", _output_object(path, name, where, leaf)))
    return found
