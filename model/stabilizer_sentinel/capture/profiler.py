"""System profiling in the job: CPU, memory, IO wait and, with a GPU, its utilisation and memory.

A ``SystemProfiler`` samples the node every ``interval_ms`` milliseconds on a background thread
(Debugger's profiler samples every 500 ms by default) and hands each sample to its sinks: the
tensor store (``system/<first sample time>.json``, one file per batch of samples, written whole
and renamed like every store file) and the in-job ``MemoryTrial`` the sentinel's profiler rules
read. A sample is a dict::

    {"timestamp": 1763900000.5,          # seconds since the epoch
     "step": 42,                         # the job's last training step when sampled (or null)
     "cpu": [12.0, 97.5],                # utilisation of each core, percent
     "cpu_total": 54.7,                  # utilisation of all cores, percent
     "iowait": 0.4,                      # time waiting for IO, percent of CPU time
     "memory": 31.2,                     # memory in use, percent of the node's memory
     "gpu": [88.0], "gpu_memory": [41.5]}  # per GPU, percent (empty lists without a GPU)

CPU, IO wait and memory are read from ``/proc`` (Linux, as in SageMaker's containers; no package
needed). GPU figures come from NVML when ``pynvml`` is importable, else from one long-running
``nvidia-smi`` streaming a line per interval; without either there are no GPU figures. This module
must not evaluate rules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from stabilizer_sentinel.capture import store

SYSTEM_DIR = "system"
DEFAULT_INTERVAL_MS = 500
# Samples per file: at the default interval a file every 10 s, so readers see them while the job runs.
SAMPLES_PER_FILE = 20
INTERVAL_ENV = "STABILIZER_PROFILER_INTERVAL_MS"

Sample = dict[str, Any]


def _cpu_times(stat: str) -> dict[str, tuple[int, int, int]]:
    """/proc/stat lines ``cpu``, ``cpu0``, ... -> (busy, idle + iowait, iowait) in ticks."""
    times = {}
    for line in stat.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        values = [int(v) for v in fields[:8]] + [0] * (8 - len(fields[:8]))
        user, nice, system, idle, iowait, irq, softirq, steal = values
        times[name] = (user + nice + system + irq + softirq + steal, idle + iowait, iowait)
    return times


def _memory_percent(meminfo: str) -> float:
    values = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0]) if rest.split() else 0
    total = values.get("MemTotal", 0)
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return round(100.0 * (total - available) / total, 2) if total else 0.0


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


class _Nvml:
    def __init__(self, module: Any) -> None:
        self.nvml = module
        module.nvmlInit()
        self.handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())]

    def read(self) -> tuple[list[float], list[float]]:
        util, mem = [], []
        for handle in self.handles:
            util.append(float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            mem.append(_percent(int(info.used), int(info.total)))
        return util, mem

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


class _NvidiaSmi:
    """One ``nvidia-smi`` process printing a line per GPU every interval; a reader keeps the latest."""

    def __init__(self, executable: str, interval_ms: int) -> None:
        self.process = subprocess.Popen(
            [executable, "--query-gpu=index,utilization.gpu,memory.used,memory.total",
             "--format=csv,noheader,nounits", f"-lms={max(interval_ms, 100)}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.latest: dict[int, tuple[float, float]] = {}
        self.thread = threading.Thread(target=self._read, name="nvidia-smi-reader", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            parts = [part.strip() for part in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                index, util, used, total = int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3])
                self.latest[index] = (util, round(100.0 * used / total, 2) if total else 0.0)

    def read(self) -> tuple[list[float], list[float]]:
        latest = dict(self.latest)
        return [latest[i][0] for i in sorted(latest)], [latest[i][1] for i in sorted(latest)]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)


def gpu_reader(interval_ms: int) -> _Nvml | _NvidiaSmi | None:
    """NVML if available, else a streaming nvidia-smi, else None (no GPU figures)."""
    with contextlib.suppress(Exception):
        import pynvml  # type: ignore[import-not-found]

        reader = _Nvml(pynvml)
        if reader.handles:
            return reader
    executable = shutil.which("nvidia-smi")
    if executable:
        with contextlib.suppress(OSError):
            return _NvidiaSmi(executable, interval_ms)
    return None


class SystemSampler:
    """Reads one sample at a time; CPU and IO wait are the shares of CPU time since the previous read."""

    def __init__(self, proc: Path = Path("/proc"), gpu: Any = None) -> None:
        self.proc = proc
        self.gpu = gpu
        self._previous = _cpu_times((proc / "stat").read_text())

    def sample(self, step: int | None = None) -> Sample:
        now = _cpu_times((self.proc / "stat").read_text())
        deltas = {}
        for name, (busy, idle, iowait) in now.items():
            before = self._previous.get(name, (busy, idle, iowait))
            deltas[name] = (busy - before[0], idle - before[1], iowait - before[2])
        self._previous = now
        cores = sorted((n for n in deltas if n != "cpu"), key=lambda n: int(n[3:]))
        total = deltas.get("cpu", (0, 0, 0))
        gpu, gpu_memory = self.gpu.read() if self.gpu is not None else ([], [])
        return {
            "timestamp": round(time.time(), 3),
            "step": step,
            "cpu": [_percent(deltas[c][0], deltas[c][0] + deltas[c][1]) for c in cores],
            "cpu_total": _percent(total[0], total[0] + total[1]),
            "iowait": _percent(total[2], total[0] + total[1]),
            "memory": _memory_percent((self.proc / "meminfo").read_text()),
            "gpu": gpu,
            "gpu_memory": gpu_memory,
        }


class SystemStoreWriter:
    """Writes batches of samples into ``<tensor dir>/system/`` (one whole file per batch)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.directory = Path(root) / SYSTEM_DIR
        self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, samples: list[Sample]) -> None:
        if samples:
            name = f"{int(samples[0]['timestamp'] * 1000):016d}.json"
            store.write_json_atomic(self.directory / name, {"format": store.FORMAT, "samples": samples})


def read_samples(storage: store.Storage, seen: set[str]) -> list[Sample]:
    """Samples in files of ``system/`` not in ``seen`` (which is updated), oldest first."""
    samples: list[Sample] = []
    for key in sorted(storage.list(SYSTEM_DIR)):
        if key.endswith(".json") and key not in seen:
            document = store.read_json(storage, key)
            if document is not None:
                seen.add(key)
                samples.extend(document.get("samples", []))
    return sorted(samples, key=lambda s: s["timestamp"])


class SystemProfiler:
    """Samples on a daemon thread every ``interval_ms`` and hands samples to ``sinks``.

    ``current_step`` is read at each sample (the sentinel sets it), so samples can be lined up
    with training steps. ``close()`` stops the thread and flushes the last samples.
    """

    def __init__(
        self,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        *,
        out_dir: str | os.PathLike[str] | None = None,
        sinks: Iterable[Callable[[Sample], None]] = (),
        sampler: SystemSampler | None = None,
    ) -> None:
        if interval_ms < 1:
            raise ValueError(f"profiler interval: expected at least 1 ms, got {interval_ms}")
        self.interval = interval_ms / 1000.0
        self._gpu = None if sampler is not None else gpu_reader(interval_ms)
        self.sampler = sampler or SystemSampler(gpu=self._gpu)
        self.writer = SystemStoreWriter(out_dir) if out_dir is not None else None
        self.sinks = list(sinks)
        self.current_step: int | None = None
        self.samples_taken = 0
        # CPU time the sampling thread used (user + system), for the overhead benchmark.
        self.busy_seconds = 0.0
        self._pending: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="system-profiler", daemon=True)

    def start(self) -> SystemProfiler:
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval
            self._take()

    def _take(self) -> None:
        started = time.thread_time()
        try:
            self._record()
        finally:
            self.busy_seconds += time.thread_time() - started

    def _record(self) -> None:
        try:
            sample = self.sampler.sample(self.current_step)
        except OSError:
            return  # /proc unreadable (not Linux): nothing to record
        self.samples_taken += 1
        for sink in self.sinks:
            sink(sample)
        if self.writer is not None:
            self._pending.append(sample)
            if len(self._pending) >= SAMPLES_PER_FILE:
                self.writer.write(self._pending)
                self._pending = []

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.writer is not None:
            self.writer.write(self._pending)
            self._pending = []
        if self._gpu is not None:
            self._gpu.close()


def interval_from_env(environ: dict[str, str] | None = None) -> int | None:
    """``STABILIZER_PROFILER_INTERVAL_MS``: None when unset, 0 disables, else the interval."""
    text = (environ if environ is not None else os.environ).get(INTERVAL_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}: expected milliseconds as an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{INTERVAL_ENV}: expected 0 (off) or a positive number of milliseconds, got {value}")
    return value


def summary(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """OverallSystemUsage's figures per metric: max, p99, p95, p50, min (GPU metrics averaged over GPUs)."""
    series: dict[str, list[float]] = {"CPU": [], "CPU memory": [], "I/O wait": [], "GPU": [], "GPU memory": []}
    for sample in samples:
        series["CPU"].append(sample["cpu_total"])
        series["CPU memory"].append(sample["memory"])
        series["I/O wait"].append(sample["iowait"])
        if sample.get("gpu"):
            series["GPU"].append(sum(sample["gpu"]) / len(sample["gpu"]))
        if sample.get("gpu_memory"):
            series["GPU memory"].append(sum(sample["gpu_memory"]) / len(sample["gpu_memory"]))
    out = {}
    for name, values in series.items():
        if values:
            ordered = sorted(values)
            out[name] = {
                "max": ordered[-1],
                "p99": _quantile(ordered, 0.99),
                "p95": _quantile(ordered, 0.95),
                "p50": _quantile(ordered, 0.50),
                "min": ordered[0],
            }
    return out


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default), without NumPy."""
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (position - low), 2)


def load(path: str) -> list[Sample]:
    """Every sample of the store at ``path`` (a directory or ``s3://`` prefix), oldest first."""
    return read_samples(store.open_storage(path), set())

