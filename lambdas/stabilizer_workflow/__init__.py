"""The workflow domain behind the train and monitor Lambdas.

Pure code: typed state, remediation policies, request and notification builders. Only
`stabilizer_workflow.aws` and its adapters, one per service (`aws_sagemaker`, `aws_s3`,
`aws_stepfunctions`, `aws_sns`), touch AWS, and only through clients handed to them. Nothing here may import from
`model/` or `stabilizer/` (separate deployables), nor anything beyond the standard library,
boto3/botocore, aws_lambda_powertools and pydantic.
"""
