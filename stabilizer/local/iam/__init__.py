"""Local mode's IAM access check (strict mode): each call judged by the synthesized stack's policies.

``access_check``    records each call of the stack's principals and judges it; strict mode refuses
``iam_requests``    what IAM is asked for a call: action, resource ARN, context keys
``stack_policies``  the synthesized stack's policies per principal, with this deployment's names

It imports neither the engine nor the SageMaker emulator.
"""
