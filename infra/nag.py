"""cdk-nag acknowledgements, written next to the resource they are about.

Every construct module calls `acknowledge(construct, (rule, reason), ...)` right where it creates
the resource; tests/infra/test_checks.py proves each acknowledgement answers a real finding.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import Construct


def acknowledge(construct: Construct, *findings: tuple[str, str]) -> None:
    acknowledgments = (Acknowledgment(id=rule, reason=reason) for rule, reason in findings)
    Validations.of(construct).acknowledge(*acknowledgments)


def logical_id(construct: Construct) -> str:
    """The CloudFormation logical id of a construct's resource, as cdk-nag names it in findings."""
    return Stack.of(construct).get_logical_id(construct.node.default_child)
