"""System usage of each attempt in the report: a plot over time and OverallSystemUsage's summary.

The samples are those the job's system profiler wrote into its tensor store
(``model/stabilizer_sentinel/capture/profiler.py``, docs/contracts.md section 3); they are read with the rule
engine's own reader. An attempt without samples (profiling off) is left out. This module reads
records and stores; it never changes a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stabilizer.reports.records import RunRecord

SERIES = (("cpu_total", "CPU"), ("memory", "memory"), ("iowait", "IO wait"))


def _profiler():
    from stabilizer_sentinel.capture import profiler

    return profiler


def samples_by_attempt(record: RunRecord) -> dict[int, list[dict[str, Any]]]:
    """Attempt number -> its samples, for attempts whose tensor store holds any."""
    profiler = _profiler()
    found = {}
    for attempt in record.attempts:
        store = attempt.tensor_store
        if store and not store.startswith("s3://") and Path(store).is_dir():
            samples = profiler.load(attempt.tensor_store)
            if samples:
                found[attempt.number] = samples
    return found


def plot(record: RunRecord, directory: Path) -> list[Path]:
    """``system.png``: CPU, memory, IO wait and GPU utilisation (percent) against seconds, per attempt."""
    by_attempt = samples_by_attempt(record)
    if not by_attempt:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(len(by_attempt), 1, figsize=(8, 3 * len(by_attempt)), squeeze=False)
    for row, (number, samples) in zip(axes[:, 0], sorted(by_attempt.items()), strict=True):
        start = samples[0]["timestamp"]
        seconds = [s["timestamp"] - start for s in samples]
        for key, label in SERIES:
            row.plot(seconds, [s[key] for s in samples], label=label)
        gpus = max(len(s.get("gpu") or []) for s in samples)
        for gpu in range(gpus):
            row.plot(seconds, [(s.get("gpu") or [None] * gpus)[gpu] for s in samples], label=f"GPU {gpu}")
        row.set_ylim(0, 100)
        row.set_ylabel("percent")
        row.set_title(f"attempt {number}: system usage", fontsize=9)
        row.grid(alpha=0.3)
        row.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the first sample")
    path = directory / "system.png"
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]


def markdown_lines(record: RunRecord) -> list[str]:
    """OverallSystemUsage's figures (max, p99, p95, p50, min) per attempt, as a markdown table."""
    by_attempt = samples_by_attempt(record)
    if not by_attempt:
        return []
    profiler = _profiler()
    lines = ["", "## System usage", "", "| attempt | metric | max | p99 | p95 | p50 | min |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for number, samples in sorted(by_attempt.items()):
        for metric, figures in profiler.summary(samples).items():
            cells = [f"{figures[k]:.1f}" for k in ("max", "p99", "p95", "p50", "min")]
            lines.append(f"| {number} | {metric} (%) | " + " | ".join(cells) + " |")
    return lines
