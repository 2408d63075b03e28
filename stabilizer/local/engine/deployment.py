"""The deployment local mode stands in for: the project's parts, the settings CDK bakes in, the placeholders.

``Project`` says where the state machine's definition, the Lambda asset (``lambdas/``) and the
training source (``model/``) lie. ``LocalSettings`` holds the deployment-level values the CDK app
gives the functions (bucket, topic, roles, image, the Lambda environment of docs/contracts.md
section 4), with local stand-ins. The definition's ``${placeholders}`` are filled from the map
CDK reads too (``statemachine/placeholders.json``), each by the local value of its key; a
placeholder with no local value is an error naming it, never left in place.

Nothing here starts anything: ``stabilizer.local.engine.engine`` stands the deployment up.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stabilizer.local.checkout import in_checkout, installed_parts, project_root
from stabilizer_workflow import environment as env

if TYPE_CHECKING:
    from stabilizer.local.engine.lambda_seam import LocalLambdas
    from stabilizer.local.iam.access_check import AccessChecker
    from stabilizer.local.iam.stack_policies import DeploymentNames

PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
REGION = "us-east-1"
ACCOUNT = "123456789012"
# Strict mode: every call of the stack's principals judged by the synthesized IAM, denied ones
# refused as AWS would (`stabilizer run --local --strict`, or this variable set to 1).
STRICT_VARIABLE = "STABILIZER_STRICT"


def strict_from_environment() -> bool:
    return os.environ.get(STRICT_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}


class EngineError(Exception):
    """The local engine cannot start (a missing part of the project, a bad definition)."""


@dataclass(frozen=True)
class Project:
    """Where the parts of the project live on disk.

    ``model`` is the training source directory the reference job runs from; ``library`` the
    directory holding the in-job library's packages (a checkout's ``model/`` as well, unless given).
    """

    root: Path
    definition: Path
    lambdas: Path
    model: Path
    library: Path | None = None

    @property
    def library_root(self) -> Path:
        return self.library or self.model

    @property
    def placeholder_map(self) -> dict[str, str]:
        """``statemachine/placeholders.json``: placeholder name -> the value it stands for."""
        path = self.definition.parent / "placeholders.json"
        if not path.is_file():
            raise EngineError(f"no placeholder map beside the definition: {path}")
        return dict(json.loads(path.read_text())["placeholders"])

    @classmethod
    def discover(cls, root: Path | None = None) -> Project:
        """The project at ``root`` (a checkout); without one, this checkout or else the installed parts."""
        if root is None and not in_checkout():
            definitions, lambdas, model, library = installed_parts()
            return cls(root=definitions.parent, definition=cls._definition(definitions), lambdas=lambdas,
                       model=model, library=library)
        root = Path(root) if root else project_root()
        definition = cls._definition(root / "statemachine")
        for part in ("lambdas", "model"):
            if not (root / part).is_dir():
                raise EngineError(f"the project has no {part}/ directory under {root}")
        return cls(root=root, definition=definition, lambdas=root / "lambdas", model=root / "model")

    @staticmethod
    def _definition(statemachine: Path) -> Path:
        candidates = sorted(statemachine.glob("*.asl.json")) or sorted(statemachine.glob("*.json"))
        if not candidates:
            raise EngineError(f"no ASL definition (*.asl.json) found in {statemachine}")
        if len(candidates) > 1:
            names = ", ".join(p.name for p in candidates)
            raise EngineError(f"more than one ASL definition in {statemachine}: {names}")
        return candidates[0]


@dataclass(frozen=True)
class LocalSettings:
    """Deployment-level values the CDK app bakes in, with local stand-ins."""

    bucket: str = "stabilizer-local"
    topic_name: str = "stabilizer-local"
    state_machine_name: str = "stabilizer-local"
    train_function: str = "stabilizer-train"
    monitor_function: str = "stabilizer-monitor"
    watch_function: str = "stabilizer-watch"
    job_name_prefix: str = "stabilizer"
    instance_type: str = "ml.m5.xlarge"
    sagemaker_role: str = f"arn:aws:iam::{ACCOUNT}:role/stabilizer-sagemaker"
    states_role: str = f"arn:aws:iam::{ACCOUNT}:role/stabilizer-states"
    debugger_rules_enabled: bool = False
    # SageMaker kills a stopped job 120 s after StopTrainingJob; the local default is the same.
    stop_grace_seconds: float = 120.0
    # Added to every training job's environment, as the image's own: this machine stands for the
    # image, so a PYTHONPATH here (packages "installed in the image") comes after the job's own.
    job_environment: dict[str, str] = field(default_factory=dict)

    @property
    def topic_arn(self) -> str:
        return f"arn:aws:sns:{REGION}:{ACCOUNT}:{self.topic_name}"

    @property
    def source_uri(self) -> str:
        return f"s3://{self.bucket}/source/sourcedir.tar.gz"

    @property
    def library_uri(self) -> str:
        """Where the in-job library lies, as the stack deploys it: the jobs' `stabilizer` channel."""
        return f"s3://{self.bucket}/library/"

    def data_uri(self, channel: str) -> str:
        return f"s3://{self.bucket}/data/{channel}/"

    @property
    def state_machine_arn(self) -> str:
        return f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{self.state_machine_name}"

    def principal_of(self, function: str) -> str:
        """The stack's principal (stabilizer.local.iam.stack_policies) a local function stands for."""
        from stabilizer.local.iam.stack_policies import MONITOR, TRAIN, WATCH

        return {self.train_function: TRAIN, self.monitor_function: MONITOR, self.watch_function: WATCH}[function]

    def deployment_names(self, lambdas: LocalLambdas) -> DeploymentNames:
        """The stack's resources under their local names, to resolve the synthesized policies with."""
        from stabilizer.local.iam.stack_policies import EXECUTION_ROLE, STATE_MACHINE, DeploymentNames

        functions = (self.train_function, self.monitor_function, self.watch_function)
        return DeploymentNames(
            bucket=self.bucket,
            topic_arn=self.topic_arn,
            state_machine_arn=self.state_machine_arn,
            function_arns={self.principal_of(f): lambdas.arn(f) for f in functions},
            role_arns={
                **{self.principal_of(f): f"arn:aws:iam::{ACCOUNT}:role/{f}" for f in functions},
                STATE_MACHINE: self.states_role,
                EXECUTION_ROLE: self.sagemaker_role,
            },
            region=REGION,
            account=ACCOUNT,
        )

    def strict_access_checker(self, lambdas: LocalLambdas) -> AccessChecker:
        """Synthesize the stack (seconds) and refuse every call its roles could not make."""
        from stabilizer.local.iam.access_check import AccessChecker, evaluator_problem
        from stabilizer.local.iam.iam_requests import Where
        from stabilizer.local.iam.stack_policies import TemplateError, synthesized_policies

        problem = evaluator_problem()
        if problem:
            raise EngineError(f"strict mode: {problem}")
        names = self.deployment_names(lambdas)
        where = Where(region=REGION, account=ACCOUNT, state_machine_arn=self.state_machine_arn)
        # The stack this local deployment stands for: with Debugger rules, the one deployed with them.
        context = {"debugger_rules_enabled": "true"} if self.debugger_rules_enabled else {}
        try:
            policies = synthesized_policies(names, **context)
        except TemplateError as error:
            raise EngineError(f"strict mode: {error}") from None
        return AccessChecker(policies, where, strict=True)

    def image_environment(self) -> dict[str, str]:
        """The image variables the deployed stack bakes in (TRAINING_IMAGE_URI and its GPU build,
        FRAMEWORK_IMAGES, DEBUGGER_RULE_IMAGE with Debugger rules), resolved for the local region the
        way the CDK app resolves them: the SageMaker Python SDK's image URI lookup."""
        from stabilizer.training_images import environment_for_region

        return environment_for_region(REGION, self.debugger_rules_enabled)

    def lambda_environment(self) -> dict[str, str]:
        """The Lambda environment of docs/contracts.md section 4."""
        return {
            **self.image_environment(),
            env.BUCKET: self.bucket,
            env.TOPIC_ARN: self.topic_arn,
            env.SAGEMAKER_ROLE_ARN: self.sagemaker_role,
            env.SOURCE_S3_URI: self.source_uri,
            env.TRAIN_DATA_S3_URI: self.data_uri("train"),
            env.TEST_DATA_S3_URI: self.data_uri("test"),
            env.LIBRARY_S3_URI: self.library_uri,
            env.JOB_NAME_PREFIX: self.job_name_prefix,
            env.DEFAULT_INSTANCE_TYPE: self.instance_type,
            env.DEBUGGER_RULES_ENABLED: "true" if self.debugger_rules_enabled else "false",
            env.POWERTOOLS_SERVICE_NAME: "stabilizer",
            "POWERTOOLS_METRICS_NAMESPACE": "stabilizer",
            # No X-Ray daemon on a laptop.
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            # The local metric streams are kept to the second (stabilizer.local.engine.engine), not the minute.
            env.METRIC_PERIOD_SECONDS: "1",
        }


def fill_placeholders(definition: str, values: dict[str, str]) -> str:
    """Replace every ``${Name}``; an unknown name is an error naming it, never left in place."""
    missing = sorted({m for m in PLACEHOLDER.findall(definition) if m not in values})
    if missing:
        raise EngineError(f"no local value for the definition's placeholder(s): {', '.join(missing)}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], definition)


def placeholder_values(
    mapping: dict[str, str], settings: LocalSettings, lambdas: LocalLambdas
) -> dict[str, str]:
    """The local value of each placeholder, by the key ``statemachine/placeholders.json`` gives it."""
    local = {
        "partition": "aws",
        "train_function_arn": lambdas.arn(settings.train_function),
        "monitor_function_arn": lambdas.arn(settings.monitor_function),
        "watch_function_arn": lambdas.arn(settings.watch_function),
        "topic_arn": settings.topic_arn,
    }
    unknown = sorted(key for key in mapping.values() if key not in local)
    if unknown:
        raise EngineError(f"no local value for {', '.join(unknown)} (statemachine/placeholders.json)")
    return {name: local[key] for name, key in mapping.items()}
