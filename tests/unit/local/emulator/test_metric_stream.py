"""A local job's metric stream: each line of every host's log that a metric definition's regex
matches is sent as SageMaker sends it (namespace /aws/sagemaker/TrainingJobs, dimension
TrainingJobName), once, when the line is complete; CloudWatch refuses non-finite values, so they
are not sent."""

from __future__ import annotations

from stabilizer.local.emulator.container import Container
from stabilizer.local.emulator.training_job import LocalTrainingJob


def test_each_complete_loss_line_of_every_host_is_sent_once_with_the_jobs_name(tmp_path):
    request = {"AlgorithmSpecification": {"MetricDefinitions": [
        {"Name": "train:loss", "Regex": r"loss=(\S+)"}, {"Name": "train:acc", "Regex": r"acc=([0-9.]+)"}]},
        "ResourceConfig": {"InstanceCount": 2}}
    names = ("algo-1", "algo-2")
    hosts = [Container(tmp_path / host, request, host=host, hosts=names) for host in names]
    job = LocalTrainingJob(name="job-1", arn="arn", request=request, container=hosts[0], hosts=hosts)
    for container, text in zip(hosts, ("step=0 loss=2.5 acc=0.1\nstep=1 loss=nan\nstep=2 lo", "step=0 loss=2.4\n"),
                               strict=True):
        container.log_path.parent.mkdir(parents=True)
        container.log_path.write_text(text)
    sent: list[dict] = []
    assert job.publish_metrics(sent.extend) == 3
    assert [(d["MetricName"], d["Value"]) for d in sent] == [
        ("train:loss", 2.5), ("train:acc", 0.1), ("train:loss", 2.4)]
    assert all(d["Dimensions"] == [{"Name": "TrainingJobName", "Value": "job-1"}] for d in sent)
    with hosts[0].log_path.open("a") as log:
        log.write("ss=1.9\n")  # the half line is complete now
    sent.clear()
    assert job.publish_metrics(sent.extend) == 1 and sent[0]["Value"] == 1.9
    assert job.publish_metrics(sent.extend) == 0  # nothing new, nothing sent again
