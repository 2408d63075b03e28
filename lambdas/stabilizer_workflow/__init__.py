"""The workflow domain behind the train and monitor Lambdas.

Pure code: typed state, remediation policies, request and notification builders. Only
`stabilizer_workflow.aws` touches AWS, and only through clients handed to it. Nothing here may import from
`model/` or `stabilizer/` (separate deployables), nor anything beyond the standard library,
boto3/botocore, aws_lambda_powertools and pydantic.
"""
