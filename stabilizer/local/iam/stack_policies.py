"""The synthesized stack's IAM policies, per principal, with this deployment's names filled in.

The CDK template names resources by logical id and builds ARNs with intrinsics (`Ref`,
`Fn::GetAtt`, `Fn::Join`, `Fn::Sub`, `Fn::FindInMap`). To judge a call made in local mode (or in
a moto test) by the policy AWS would judge it by, every policy document of a role is resolved
with the names that deployment uses: its bucket, topic, functions, state machine and roles, its
region and account. An intrinsic this module cannot resolve becomes `unresolved:<what>`, a
string no request's resource matches, so an unknown name can only deny, never allow.

The principals are found by what they run, not by logical ids: the function whose handler is
`stabilizer_workflow.handlers.train.lambda_handler` is `TrainFunction`, the state machine's role is `StateMachine`,
the role SageMaker assumes is `SageMakerExecutionRole`.

It reads a template; it synthesizes nothing (tests/infra/synth.py and `synthesized_policies`
below do) and calls no AWS.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TRAIN, MONITOR, WATCH = "TrainFunction", "MonitorFunction", "WatchFunction"
STATE_MACHINE, EXECUTION_ROLE = "StateMachine", "SageMakerExecutionRole"
PRINCIPALS = (TRAIN, MONITOR, WATCH, STATE_MACHINE, EXECUTION_ROLE)
HANDLERS = {
    "stabilizer_workflow.handlers.train.lambda_handler": TRAIN,
    "stabilizer_workflow.handlers.monitor.lambda_handler": MONITOR,
    "stabilizer_workflow.handlers.watch.lambda_handler": WATCH,
}


@dataclass(frozen=True)
class DeploymentNames:
    """The names one deployment gives the stack's resources (local mode's, or a test's)."""

    bucket: str
    topic_arn: str
    state_machine_arn: str
    function_arns: dict[str, str]  # principal -> function ARN (TRAIN, MONITOR, WATCH)
    role_arns: dict[str, str]  # principal -> role ARN
    region: str = "us-east-1"
    account: str = "123456789012"
    partition: str = "aws"
    url_suffix: str = "amazonaws.com"
    stack_name: str = "stabilizer"


@dataclass(frozen=True)
class PrincipalPolicies:
    """One principal: its role's ARN and every identity policy document attached to the role."""

    principal: str
    role_arn: str
    documents: list[dict[str, Any]] = field(default_factory=list)


class TemplateError(ValueError):
    """The template lacks a principal this module expects (a resource renamed or removed)."""


def _role_of(value: Any) -> str | None:
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return value["Fn::GetAtt"][0]
    return None


def principal_roles(template: dict[str, Any]) -> dict[str, str]:
    """principal -> logical id of its role."""
    resources = template["Resources"]
    roles: dict[str, str] = {}
    for logical_id, resource in resources.items():
        kind, properties = resource["Type"], resource.get("Properties", {})
        if kind == "AWS::Lambda::Function" and properties.get("Handler") in HANDLERS:
            roles[HANDLERS[properties["Handler"]]] = _role_of(properties.get("Role")) or ""
        elif kind == "AWS::StepFunctions::StateMachine":
            roles[STATE_MACHINE] = _role_of(properties.get("RoleArn")) or ""
        elif kind == "AWS::IAM::Role":
            trust = json.dumps(properties.get("AssumeRolePolicyDocument", {}))
            if '"sagemaker.amazonaws.com"' in trust:
                roles[EXECUTION_ROLE] = logical_id
    missing = [p for p in PRINCIPALS if not roles.get(p)]
    if missing:
        raise TemplateError(f"the template has no role for {', '.join(missing)}")
    return roles


class _Resolver:
    def __init__(self, template: dict[str, Any], names: DeploymentNames, roles: dict[str, str]) -> None:
        self.template = template
        self.names = names
        self.refs: dict[str, str] = {
            "AWS::Partition": names.partition,
            "AWS::Region": names.region,
            "AWS::AccountId": names.account,
            "AWS::URLSuffix": names.url_suffix,
            "AWS::StackName": names.stack_name,
        }
        self.attrs: dict[tuple[str, str], str] = {}
        for principal, role in roles.items():
            self.attrs[(role, "Arn")] = names.role_arns[principal]
            self.refs[role] = names.role_arns[principal].rsplit("/", 1)[-1]
        for logical_id, resource in template["Resources"].items():
            kind, properties = resource["Type"], resource.get("Properties", {})
            if kind == "AWS::S3::Bucket":
                self.refs[logical_id] = names.bucket
                self.attrs[(logical_id, "Arn")] = f"arn:{names.partition}:s3:::{names.bucket}"
            elif kind == "AWS::SNS::Topic":
                self.refs[logical_id] = self.attrs[(logical_id, "TopicArn")] = names.topic_arn
            elif kind == "AWS::StepFunctions::StateMachine":
                self.refs[logical_id] = names.state_machine_arn
                self.attrs[(logical_id, "Name")] = names.state_machine_arn.rsplit(":", 1)[-1]
            elif kind == "AWS::Lambda::Function" and properties.get("Handler") in HANDLERS:
                arn = names.function_arns[HANDLERS[properties["Handler"]]]
                self.attrs[(logical_id, "Arn")] = arn
                self.refs[logical_id] = arn.rsplit(":", 1)[-1]

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if not isinstance(value, dict):
            return value
        intrinsic = self._intrinsics().get(next(iter(value))) if len(value) == 1 else None
        if intrinsic is None:
            return {key: self.resolve(item) for key, item in value.items()}
        return intrinsic(next(iter(value.values())))

    def _intrinsics(self) -> dict[str, Any]:
        return {
            "Ref": lambda name: self.refs.get(name, f"unresolved:{name}"),
            "Fn::GetAtt": self._get_att,
            "Fn::Join": lambda arg: arg[0].join(str(self.resolve(item)) for item in self.resolve(arg[1])),
            "Fn::Sub": self._substitute,
            "Fn::FindInMap": self._find_in_map,
            "Fn::Select": lambda arg: self.resolve(arg[1])[int(self.resolve(arg[0]))],
            "Fn::Split": lambda arg: str(self.resolve(arg[1])).split(arg[0]),
        }

    def _get_att(self, argument: Any) -> str:
        logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
        return self.attrs.get((logical_id, attribute), f"unresolved:{logical_id}.{attribute}")

    def _substitute(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        variables = {name: self.resolve(v) for name, v in variables.items()}
        return re.sub(r"\$\{([^}!]+)\}", lambda m: str(self._sub(m.group(1), variables)), text)

    def _find_in_map(self, argument: Any) -> Any:
        mapping, first, second = (self.resolve(item) for item in argument)
        found = self.template.get("Mappings", {}).get(mapping, {}).get(first, {}).get(second)
        return found if found is not None else f"unresolved:{mapping}.{first}.{second}"

    def _sub(self, name: str, variables: dict[str, Any]) -> Any:
        if name in variables:
            return variables[name]
        if "." in name:
            return self.resolve({"Fn::GetAtt": name.split(".", 1)})
        return self.resolve({"Ref": name})


def principal_policies(template: dict[str, Any], names: DeploymentNames) -> dict[str, PrincipalPolicies]:
    """Every principal's identity policies, resolved with `names`.

    Inline policies of the role and every `AWS::IAM::Policy` attached to it are included; managed
    policies are not (the stack attaches none to these roles: tests/infra checks that).
    """
    roles = principal_roles(template)
    resolver = _Resolver(template, names, roles)
    found: dict[str, PrincipalPolicies] = {}
    for principal, role in roles.items():
        documents = []
        role_properties = template["Resources"][role].get("Properties", {})
        for inline in role_properties.get("Policies", []):
            documents.append(resolver.resolve(inline["PolicyDocument"]))
        for resource in template["Resources"].values():
            if resource["Type"] != "AWS::IAM::Policy":
                continue
            attached = resource["Properties"].get("Roles", [])
            if {"Ref": role} in attached:
                documents.append(resolver.resolve(resource["Properties"]["PolicyDocument"]))
        found[principal] = PrincipalPolicies(principal, names.role_arns[principal], documents)
    return found


def managed_policy_arns(template: dict[str, Any]) -> dict[str, list[Any]]:
    """principal -> the managed policy ARNs its role lists (expected to be none)."""
    roles = principal_roles(template)
    return {
        principal: list(template["Resources"][role].get("Properties", {}).get("ManagedPolicyArns", []))
        for principal, role in roles.items()
    }


# Run from the checkout's root (`python -c` imports from the working directory): the template as JSON.
_SYNTH = """
import json, shutil, sys, tempfile
import aws_cdk as cdk
from aws_cdk.assertions import Template
from app import build_app
outdir = tempfile.mkdtemp(prefix="stabilizer-synth-")
try:
    _, stack = build_app(cdk.App(context=json.loads(sys.argv[1]), outdir=outdir))
    print(json.dumps(Template.from_stack(stack).to_json()))
finally:
    shutil.rmtree(outdir, ignore_errors=True)
"""


def synthesized_policies(names: DeploymentNames, **context: Any) -> dict[str, PrincipalPolicies]:
    """Synthesize the CDK app (seconds; needs the `infra` extra and Node.js) and resolve its policies.

    The app (`app.py`, `infra/`) belongs to the checkout, not to an installed package: it is run
    from the checkout's root in its own interpreter, which prints the template.
    """
    import json
    import subprocess
    import sys

    from stabilizer.local.checkout import project_root

    root = project_root()
    if not (root / "app.py").is_file():
        raise TemplateError(f"synthesizing the stack needs the CDK app (app.py), which {root} does not hold")
    result = subprocess.run(
        [sys.executable, "-c", _SYNTH, json.dumps(context)], cwd=root, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise TemplateError(f"synthesizing the stack failed ({last}); install the `dev` extra")
    template = json.loads(result.stdout)
    return principal_policies(template, names)
