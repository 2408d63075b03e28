"""The report shows each attempt's system usage when its job profiled the system."""

from __future__ import annotations

from stabilizer.reports.records import AttemptRecord, RunRecord
from stabilizer.reports.report import write_report
from stabilizer_sentinel.capture.profiler import SystemStoreWriter


def test_the_report_plots_and_summarises_the_profilers_samples(tmp_path):
    store = tmp_path / "attempt-1" / "tensors"
    samples = [{"timestamp": 100.0 + i / 2, "step": i, "cpu": [50.0 + i, 10.0], "cpu_total": 30.0 + i,
                "iowait": 1.0, "memory": 40.0, "gpu": [80.0], "gpu_memory": [25.0]} for i in range(21)]
    SystemStoreWriter(store).write(samples[:10])
    SystemStoreWriter(store).write(samples[10:])
    record = RunRecord("arn", "run", {}, attempts=[AttemptRecord(1, "job-1", tensor_store=str(store)),
                                                    AttemptRecord(2, "job-2", tensor_store=str(tmp_path / "none"))])
    written = write_report(record, tmp_path / "report")
    assert written["system"].is_file() and written["system"].stat().st_size > 10_000
    text = written["markdown"].read_text()
    assert "## System usage" in text
    assert "| 1 | CPU (%) | 50.0 | 49.8 | 49.0 | 40.0 | 30.0 |" in text  # cpu_total 30..50: max p99 p95 p50 min
    assert "| 1 | GPU (%) | 80.0 |" in text and "| 2 | CPU" not in text


def test_no_system_section_without_samples(tmp_path):
    record = RunRecord("arn", "run", {}, attempts=[AttemptRecord(1, "job-1", tensor_store=str(tmp_path))])
    written = write_report(record, tmp_path / "report")
    assert "system" not in written and "## System usage" not in written["markdown"].read_text()
