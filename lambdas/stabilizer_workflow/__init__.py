"""The workflow domain behind the train, monitor and watch Lambdas.

Pure code: typed state, remediation policies, request and notification builders. Only
`stabilizer_workflow.aws` and its adapters, one per service (`aws.sagemaker`, `aws.s3`,
`aws.stepfunctions`, `aws.sns`, `aws.cloudwatch`), touch AWS, and only through clients handed to
them. Nothing here may import from `model/` or `stabilizer/` (separate deployables), nor anything
beyond the standard library, boto3/botocore, aws_lambda_powertools and pydantic.

One subpackage per feature (docs/layout.md); imports point down this list, never up:

- `handlers/`: the Lambda entry points (train, monitor, watch): each parses, calls one function, returns.
- `launch/`: the train Lambda's decisions: the first state from the input, checked before anything
  launches, and the next attempt's CreateTrainingJob request.
- `monitoring/`: the monitor's decision after one look at a job, and the watch function's decisions.
- `aws/`: the AWS edge and one adapter per service.
- `remedies/`: what follows a finding: the policies, the remedy table, rates, hangs, in-job rollbacks.
- `evidence/`: what a job left (the sentinel's files, DescribeTrainingJob) and what it says.
- `execution/`: what an execution carries: its input, the user's job, the state payload, their bounds.
- beside them: `errors` (the names the state machine catches), `environment` and `settings` (the
  Lambda environment), `telemetry` (logs, metrics, traces), `notifications` (the SNS messages).
"""
