"""S3 URIs are read in one place (stabilizer_contract.s3_uris) by the workflow, the client and local
mode alike, so a key with ``?`` or ``#`` or a bucket-only URI means the same everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stabilizer_contract.s3_uris import is_s3_uri, parse_s3_uri, split_s3_uri

ROOT = Path(__file__).resolve().parents[3]
# Where a URI might be taken apart by hand: the workflow, the client and local mode, the stack, the
# in-job library (the parser is in the dependency-free contract, which the library carries).
DIRECTORIES = ("stabilizer", "lambdas", "infra", "model")
THE_PARSER = ROOT / "model" / "stabilizer_contract" / "s3_uris.py"
BY_HAND = re.compile(
    r"""removeprefix\(\s*["']s3://|len\(\s*["']s3://["']\s*\)|\[5\s*:\s*\]|\bre\.\w+\(\s*r?["']\^?s3://"""
)


def test_a_key_is_taken_as_it_is_and_a_bucket_alone_has_an_empty_key():
    assert split_s3_uri("s3://bucket/a/b?c#d") == ("bucket", "a/b?c#d")
    assert parse_s3_uri("s3://bucket") == ("bucket", "")
    assert parse_s3_uri("s3://bucket/prefix/") == ("bucket", "prefix/")


@pytest.mark.parametrize("uri", ["/tmp/data", "https://bucket/key", "s3:///key", ""])
def test_what_is_not_an_s3_uri_is_refused_saying_what_was_expected(uri):
    with pytest.raises(ValueError, match=r"expected an s3://bucket/key URI"):
        parse_s3_uri(uri)
    assert not is_s3_uri(uri)


def test_the_pattern_recognises_each_way_of_taking_a_uri_apart_by_hand():
    for by_hand in ('uri.removeprefix("s3://").partition("/")', 'uri[len("s3://") :]', "uri[5:]",
                    're.match(r"^s3://(?P<bucket>[^/]+)", uri)', "_S3 = re.compile(r'^s3://[^/]+/.+')"):
        assert BY_HAND.search(by_hand), by_hand
    for fine in ('f"s3://{bucket}/{key}"', 'uri.startswith("s3://")', "split_s3_uri(uri)", 'store.startswith("s3://")'):
        assert not BY_HAND.search(fine), fine


def test_no_module_but_the_parser_takes_an_s3_uri_apart():
    found = {}
    for directory in DIRECTORIES:
        for path in (ROOT / directory).rglob("*.py"):
            if path == THE_PARSER or "__pycache__" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if BY_HAND.search(line):
                    found[f"{path.relative_to(ROOT).as_posix()}:{number}"] = line.strip()
    assert found == {}


@pytest.mark.parametrize("value", ["s3://stabilizer-bucket", "s3://stabilizer-bucket/", "/opt/source.tar.gz"])
def test_a_deployment_whose_source_uri_names_no_object_fails_at_cold_start_naming_the_variable(value):
    from stabilizer_workflow.errors import MisconfiguredEnvironment
    from stabilizer_workflow.settings import TrainSettings
    from tests.unit.workflow.conftest import ENV

    with pytest.raises(MisconfiguredEnvironment, match=r"SOURCE_S3_URI.*expected an s3://bucket/key URI"):
        TrainSettings.from_env({**ENV, "SOURCE_S3_URI": value})
    assert TrainSettings.from_env(ENV).source_s3_uri == ENV["SOURCE_S3_URI"]
