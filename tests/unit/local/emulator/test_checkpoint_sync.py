"""Local mode's checkpoint sync (stabilizer.local.emulator.s3files.DirectorySync): what it uploads is
always one whole version of a file, even while the job replaces that file (its findings.json is
rewritten, through a rename, at every finding and at the end)."""

from __future__ import annotations

import json
import os
import threading

import boto3
from moto import mock_aws

from stabilizer.local.emulator.s3files import DirectorySync


def test_a_file_replaced_while_it_is_uploaded_arrives_whole(tmp_path):
    local = tmp_path / "checkpoints"
    local.mkdir()
    target = local / "findings.json"
    versions = [json.dumps({"findings": [], "pad": "x" * size}).encode() for size in (10, 4000)]
    target.write_bytes(versions[0])
    done = threading.Event()

    def rewrite() -> None:  # the job: write a temporary name, then rename over the file
        turn = 0
        while not done.is_set():
            turn += 1
            partial = local / f".findings.json.{turn}.tmp"
            partial.write_bytes(versions[turn % 2])
            os.replace(partial, target)

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="checkpoint-sync")
        sync = DirectorySync(s3, local, "s3://checkpoint-sync/job/checkpoints")
        writer = threading.Thread(target=rewrite)
        writer.start()
        try:
            seen = []
            for _ in range(100):
                sync._seen.clear()  # upload every time, whatever changed
                sync.sync()
                seen.append(s3.get_object(Bucket="checkpoint-sync", Key="job/checkpoints/findings.json")["Body"].read())
        finally:
            done.set()
            writer.join()
    assert len(seen) == 100 and all(body in versions for body in seen)
    assert {body for body in seen} == set(versions)  # the writer did replace it while uploads ran
