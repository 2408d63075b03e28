"""Profiler rules over system metrics: LowGPUUtilization, CPUBottleneck, IOBottleneck, OverallSystemUsage.

They read the samples of the system profiler (stabilizer_sentinel/capture/profiler.py) through
``trial.system_samples()``, not tensors. Their computations follow Debugger's own implementations
(smdebug's profiler rules, public until December 2020): a data point is one sample; the rules
count data points from the start and decide once more than ``patience`` were seen. Names,
parameters and defaults are those of the guide (stabilizer_contract/catalogue.py). ``scan_interval_us``
is how often a decision is taken: at an invocation whose newest sample is at least that long after
the previous decision (Debugger scans its timeline files at that interval).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stabilizer_sentinel.capture.profiler import summary
from stabilizer_sentinel.capture.trial import Trial
from stabilizer_sentinel.rules.base import Rule, register_rule


class _SystemRule(Rule):
    reads_system_metrics = True

    def __init__(self, base_trial: Trial, scan_interval_us: int) -> None:
        super().__init__(base_trial)
        self.scan_interval_us = scan_interval_us
        self._last_seen: float | None = None
        self._last_decision: float | None = None
        self.datapoints = 0

    def _new_samples(self) -> list[dict[str, Any]]:
        samples = self.base_trial.system_samples()
        if self._last_seen is not None:
            samples = [s for s in samples if s["timestamp"] > self._last_seen]
        if samples:
            self._last_seen = samples[-1]["timestamp"]
        return samples

    def _decision_due(self) -> bool:
        if self._last_seen is None:
            return False
        if self._last_decision is not None and (self._last_seen - self._last_decision) * 1e6 < self.scan_interval_us:
            return False
        self._last_decision = self._last_seen
        return True

    def invoke_at_step(self, step: int) -> bool:
        for sample in self._new_samples():
            self.datapoints += 1
            self.consume(sample)
        return self._decision_due() and self.decide(step)

    def consume(self, sample: dict[str, Any]) -> None:
        raise NotImplementedError

    def decide(self, step: int) -> bool:
        raise NotImplementedError


@register_rule
class LowGPUUtilization(_SystemRule):
    """Fires, per GPU, once more than ``patience`` values were seen, when the 95th percentile of the
    last ``window`` values is below ``threshold_p95`` (underused), or above it while the 5th
    percentile is below ``threshold_p5`` (fluctuating). No GPU, no finding."""

    def __init__(
        self,
        base_trial: Trial,
        *,
        threshold_p95: float = 70,
        threshold_p5: float = 10,
        window: int = 500,
        patience: int = 1000,
        scan_interval_us: int = 60_000_000,
    ) -> None:
        super().__init__(base_trial, scan_interval_us)
        self.threshold_p95 = threshold_p95
        self.threshold_p5 = threshold_p5
        self.window = window
        self.patience = patience
        self.values: dict[int, list[float]] = {}

    def consume(self, sample: dict[str, Any]) -> None:
        for gpu, value in enumerate(sample.get("gpu") or []):
            self.values.setdefault(gpu, []).append(float(value))

    def decide(self, step: int) -> bool:
        for gpu, values in self.values.items():
            if len(values) <= self.patience:
                continue
            recent = values[-self.window :]
            p95, p5 = float(np.quantile(recent, 0.95)), float(np.quantile(recent, 0.05))
            if p95 < self.threshold_p95:
                return self.fire(step, f"GPU {gpu} is underused: 95th percentile of its utilisation over the last "
                                 f"{len(recent)} samples is {p95:.0f}%, below {self.threshold_p95:g}%",
                                 f"system/gpu{gpu}", p95)
            if p5 < self.threshold_p5:
                return self.fire(step, f"GPU {gpu} utilisation fluctuates: 95th percentile {p95:.0f}% but 5th "
                                 f"percentile {p5:.0f}%, below {self.threshold_p5:g}%", f"system/gpu{gpu}", p5)
        return False


class _Bottleneck(_SystemRule):
    """A data point is a bottleneck when some GPU is below ``gpu_threshold`` while ``busy`` is above its
    threshold; fires when bottlenecks are more than ``threshold`` percent of more than ``patience``
    data points."""

    what = ""

    def __init__(self, base_trial: Trial, threshold: float, gpu_threshold: float, patience: int,
                 scan_interval_us: int) -> None:
        super().__init__(base_trial, scan_interval_us)
        self.threshold = threshold
        self.gpu_threshold = gpu_threshold
        self.patience = patience
        self.bottlenecks = 0
        self.low_gpu = 0

    def busy(self, sample: dict[str, Any]) -> bool:
        raise NotImplementedError

    def consume(self, sample: dict[str, Any]) -> None:
        low_gpu = any(value < self.gpu_threshold for value in sample.get("gpu") or [])
        self.low_gpu += low_gpu
        self.bottlenecks += low_gpu and self.busy(sample)

    def decide(self, step: int) -> bool:
        if self.datapoints <= self.patience:
            return False
        share = self.bottlenecks / self.datapoints * 100
        if share > self.threshold:
            return self.fire(step, f"{self.bottlenecks} of {self.datapoints} samples ({share:.0f}%) are {self.what} "
                             f"bottlenecks (a GPU below {self.gpu_threshold:g}%), more than {self.threshold:g}%",
                             "system", share)
        return False


@register_rule
class CPUBottleneck(_Bottleneck):
    what = "CPU"

    def __init__(
        self,
        base_trial: Trial,
        *,
        threshold: float = 50,
        gpu_threshold: float = 10,
        cpu_threshold: float = 90,
        patience: int = 100,
        scan_interval_us: int = 60_000_000,
    ) -> None:
        super().__init__(base_trial, threshold, gpu_threshold, patience, scan_interval_us)
        self.cpu_threshold = cpu_threshold

    def busy(self, sample: dict[str, Any]) -> bool:
        """smdebug's condition: some core above ``cpu_threshold``."""
        return any(value > self.cpu_threshold for value in sample.get("cpu") or [])


@register_rule
class IOBottleneck(_Bottleneck):
    what = "IO"

    def __init__(
        self,
        base_trial: Trial,
        *,
        threshold: float = 50,
        gpu_threshold: float = 70,
        io_threshold: float = 50,
        patience: int = 1000,
        scan_interval_us: int = 60_000_000,
    ) -> None:
        super().__init__(base_trial, threshold, gpu_threshold, patience, scan_interval_us)
        self.io_threshold = io_threshold

    def busy(self, sample: dict[str, Any]) -> bool:
        return float(sample.get("iowait") or 0.0) > self.io_threshold


@register_rule
class OverallSystemUsage(_SystemRule):
    """Summarises CPU, memory, IO wait and GPU use (max, p99, p95, p50, min) in ``usage``; never fires,
    as Debugger's does not (other rules judge under-use)."""

    def __init__(self, base_trial: Trial, *, scan_interval_us: int = 60_000_000) -> None:
        super().__init__(base_trial, scan_interval_us)
        self.usage: dict[str, dict[str, float]] = {}
        self._samples: list[dict[str, Any]] = []

    def consume(self, sample: dict[str, Any]) -> None:
        self._samples.append(sample)

    def decide(self, step: int) -> bool:
        self.usage = summary(self._samples)
        return False
