"""The watchdog: a thread that notices a training loop that stopped taking steps (a hang) or a rank
that lags the others (a straggler), without relying on the thread that is stuck.

A hang is a rank stuck in a collective whose peer never arrives, a data loader that deadlocked, a
host that died: the loop's own thread never comes back to say so, and the job would run (and bill)
until ``MaxRuntimeInSeconds``. The watchdog runs beside it and judges the time since the last
optimizer step (the guard calls ``beat`` after each):

- **hang**: no step for longer than ``max(floor, factor x median step time)`` (the median of the
  last 50 step intervals); before the run's second step, for longer than ``startup`` seconds (data
  download, compilation and the first step's allocations are slow). Time the training thread spends
  working counts as no hang (``Activity``): an evaluation, an export after the last step, a phase of
  the script the guard does not count (a sweep's next model) compute; a thread blocked in a
  collective, a deadlocked loader or a lock waits. On a tick where that thread's CPU time grew by at
  least ``ACTIVE_SHARE`` of the tick (Linux's per-thread counters), or the CPU time of the process's
  children did (data loader workers or an evaluator process the thread waits for: stop 78's hunt), or
  the device the model is on allocated memory, the clock restarts; so it does where another rank's step
  moved (its heartbeat, read once this rank has been idle for half its bound): a rank waiting at the
  script's barrier while another trains on alone is no hang of the job. A thread that busy-waits (a
  spinning CUDA synchronisation), or a child that spins, reads as working: PyTorch's own collective
  timeout ends the first;
- the bounds (stabilizer_sentinel.detection.hang_bounds) come from ``STABILIZER_HANG_FLOOR_SECONDS``
  (default 600: above NCCL's and gloo's own collective timeouts would be too late, below a long
  evaluation between two steps too early), ``STABILIZER_HANG_FACTOR`` (default 10) and
  ``STABILIZER_HANG_STARTUP_SECONDS`` (default three floors); ``STABILIZER_HANG_FLOOR_SECONDS=0``
  turns the watchdog off. The floor must exceed the longest pause a healthy loop takes between two
  optimizer steps (an evaluation, a checkpoint);
- each tick (a tenth of the floor, at most a second) every rank publishes a heartbeat (its step,
  wall time, host and median busy time) to the job's rendezvous store (torchrun's
  ``MASTER_ADDR:MASTER_PORT``), through a connection of its own. When a rank's bound passes, the
  ranks furthest behind (or whose heartbeat stopped: a dead process) are the ones the finding names,
  with their host (``SM_CURRENT_HOST``);
- the finding is ``Hang`` (tensor ``steps``, value the seconds without a step): rank 0 records it
  through the sentinel (findings.json, the rewind copies written as checkpoints first), every rank
  writes the failure file ``RuleStop: Hang at step N: ...`` and leaves with status 86, rank 0 last
  (its exit makes torchrun end the others, so it waits a few seconds for them to say they left). Action
  ``notify`` records it without stopping;
- **straggler**: a rank whose median busy time (from the end of one step to the end of its next
  forward pass: data loading and forward compute, no collective) exceeds ``STABILIZER_STRAGGLER_FACTOR``
  (default 2; 0 turns it off) times the median of the other ranks', on three ticks in a row, is
  reported once by rank 0 with its rank and host: a line on stderr and ``stragglers.json`` beside
  findings.json. A straggler slows the job; it does not stop it. Not once rank 0 steps apart from the
  others (``Guard.apart``: uneven inputs, a network of each rank's own, rank 0 training alone): their
  steps are no longer one step's, and rank 0 alone read as 770 times slower than the rank waiting for it
  at the script's barrier (stop 76);
- **progress** for the monitor: rank 0 writes ``progress.json`` (the step reached, the time) beside
  findings.json whenever the step moved, at most every 30 s (half the floor when that is shorter).

This module must not decide what follows a hang (the workflow relaunches: stabilizer_workflow.remedies.hangs),
nor touch the model, the optimizer or the training thread's state.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.detection.hang_bounds import HangBounds
from stabilizer_sentinel.failsafe import shielded
from stabilizer_sentinel.loops import bare_tensors
from stabilizer_sentinel.say import say

HANG = "Hang"
STRAGGLER = "Straggler"
EXIT_HANG = 86  # a rule stop (sentinel.EXIT_RULE_STOP): the workflow reads the finding
STRAGGLERS_FILE = "stragglers.json"
# Rank 0 writes the step it reached here when it moved, at most this often: the monitor's own view of
# progress (stabilizer_workflow.remedies.hangs.no_progress), which still works when the whole process froze.
PROGRESS_FILE = "progress.json"
PROGRESS_EVERY = 30.0
INTERVALS = 50  # step intervals the median is taken over
STRAGGLER_WINDOW = 20  # busy times per rank the straggler median is taken over
STRAGGLER_TICKS = 3  # consecutive ticks a rank must lag before it is reported
STRAGGLER_MIN_EXCESS = 0.005  # seconds: below this a "slower" rank is timer noise
REPORT_WAIT_SECONDS = 10.0  # how long other ranks give rank 0 to record the finding before leaving
_PREFIX = "stabilizer/watchdog"
# Of a tick's wall time, the share of CPU time the training thread must use for the tick to count as work.
# A quarter: a thread that computes on cores it shares with other busy processes gets less than half of
# them (an evaluation with five busy processes on two cores read as a hang at 0.5 in three runs of three,
# and as work at 0.25 in three of three); a thread that waits uses next to none.
ACTIVE_SHARE = 0.25


class Activity:
    """Whether the training thread worked since the last look: its CPU time (``/proc/self/task/<id>/stat``,
    Linux) grew by ``ACTIVE_SHARE`` of the wall time, or so did the CPU time of the process's children together
    (``children_cpu``: data loader workers, an evaluator the script runs with ``subprocess.run``, while the training
    thread waits for them), or the device its model is on made allocations (``torch.cuda.memory_stats``, read
    only where CUDA is initialised: no context is made here). Where none can be read, nothing counts as work and
    the watchdog judges by steps alone."""

    def __init__(self, thread_id: int, device: Any = None) -> None:
        self._stat = f"/proc/self/task/{thread_id}/stat"
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._device = device if getattr(device, "type", None) == "cuda" else None
        self._last = (self._cpu(), children_cpu(self._ticks), self._allocations(), time.monotonic())

    def worked(self) -> bool:
        cpu, children, allocations, now = self._cpu(), children_cpu(self._ticks), self._allocations(), time.monotonic()
        (cpu_before, children_before, allocations_before, before), self._last = self._last, (
            cpu, children, allocations, now)
        least = ACTIVE_SHARE * (now - before)
        busy = cpu is not None and cpu_before is not None and cpu - cpu_before >= least
        helped = children is not None and children_before is not None and children - children_before >= least
        return busy or helped or (allocations is not None and allocations != allocations_before)

    def _cpu(self) -> float | None:
        seconds = _stat_seconds(self._stat, self._ticks)
        return None if seconds is None else seconds[0]

    def _allocations(self) -> int | None:
        if self._device is None:
            return None
        try:
            import torch

            if not torch.cuda.is_initialized():
                return None
            return int(torch.cuda.memory_stats(self._device).get("allocation.all.allocated", 0))
        except Exception:  # a device that cannot say: steps alone judge
            return None


def _stat_seconds(path: str, ticks: int) -> tuple[float, float] | None:
    """The CPU seconds a ``/proc/.../stat`` file counts: its own (user and system time) and those of the children
    its process waited for (``cutime``, ``cstime``); None where it cannot be read (a process gone)."""
    try:
        with open(path) as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the name, which may hold spaces
        own, waited = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return None
    return own / ticks, waited / ticks


def _children(pid: str) -> list[str]:
    """The process ids of ``pid``'s children, from each of its threads' ``children`` file (Linux)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for thread in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{thread}/children") as listed:
                found.extend(listed.read().split())
    return found


def children_cpu(ticks: int) -> float | None:
    """The CPU seconds of this process's children and theirs, those running and those waited for; None where
    Linux's ``children`` files cannot be read. A child that ends between two looks moves from the first count to
    the second (its parent waits for it); one never waited for drops out, which reads as no work."""
    own = _stat_seconds("/proc/self/stat", ticks)
    if own is None or not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
        return None
    total = own[1]  # the children waited for
    pending, seen = _children("self"), set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += sum(_stat_seconds(f"/proc/{pid}/stat", ticks) or ())
        pending.extend(_children(pid))
    return total


class Heartbeats:
    """Each rank's last heartbeat, in the job's rendezvous store (a connection of the watchdog's own)."""

    def __init__(self, rank: int, world_size: int, environ: Mapping[str, str]) -> None:
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        run = f"{environ.get('TORCHELASTIC_RUN_ID', 'run')}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.prefix = f"{_PREFIX}/{run}"
        self.store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), is_master=False,
                                   timeout=timedelta(seconds=5), wait_for_workers=False)

    def publish(self, beat: dict[str, Any]) -> None:
        self.store.set(f"{self.prefix}/beat/{self.rank}", json.dumps(beat))

    def read(self) -> dict[int, dict[str, Any]]:
        keys = [f"{self.prefix}/beat/{rank}" for rank in range(self.world_size)]
        found: dict[int, dict[str, Any]] = {}
        for rank, key in enumerate(keys):
            if self.store.check([key]):
                found[rank] = json.loads(self.store.get(key))
        return found

    def mark_reported(self) -> None:
        self.store.set(f"{self.prefix}/reported", "1")

    def wait_reported(self, seconds: float) -> bool:
        return self._wait([f"{self.prefix}/reported"], seconds)

    def mark_left(self) -> None:
        self.store.set(f"{self.prefix}/left/{self.rank}", "1")

    def wait_left(self, ranks: list[int], seconds: float) -> bool:
        """Until each of ``ranks`` said it is leaving: rank 0's exit makes torchrun end the others."""
        return self._wait([f"{self.prefix}/left/{rank}" for rank in ranks], seconds)

    def _wait(self, keys: list[str], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not keys or self.store.check(keys):
                return True
            time.sleep(0.05)
        return False


def laggards(beats: Mapping[int, Mapping[str, Any]], *, now: float, stale_after: float) -> list[int]:
    """The ranks holding the others up: those whose heartbeat stopped, else those furthest behind."""
    stale = sorted(rank for rank, beat in beats.items() if now - float(beat["wall"]) > stale_after)
    if stale:
        return stale
    if not beats:
        return []
    # Within a step, a rank whose forward pass ended is further on than one that never got to it.
    progress = {rank: (int(beat["step"]), bool(beat.get("forward"))) for rank, beat in beats.items()}
    lowest = min(progress.values())
    behind = sorted(rank for rank, where in progress.items() if where == lowest)
    return behind if len(behind) < len(beats) else []  # all at one step: none singled out


def stragglers(beats: Mapping[int, Mapping[str, Any]], factor: float) -> dict[int, float]:
    """Rank -> how many times slower than the median of the others its busy time is, for the laggards."""
    busy = {rank: beat.get("busy") for rank, beat in beats.items()}
    known = {rank: float(value) for rank, value in busy.items() if value is not None}
    if factor <= 0 or len(known) < 2:
        return {}
    found = {}
    for rank, value in known.items():
        others = statistics.median(v for r, v in known.items() if r != rank)
        if value > factor * others and value - others > STRAGGLER_MIN_EXCESS:
            found[rank] = value / max(others, 1e-9)
    return found


class Watchdog:
    """One process's watchdog thread; see the module docstring. ``guard`` is the process's Guard."""

    def __init__(self, guard: Any, bounds: HangBounds, *, environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        env = dict(os.environ if environ is None else environ)
        self.guard, self.bounds, self.clock = guard, bounds, clock
        self.rank, self.world_size = guard.rank, guard.world_size
        self.host = env.get("SM_CURRENT_HOST", "algo-1")
        self.intervals: deque[float] = deque(maxlen=INTERVALS)
        self.busy: deque[float] = deque(maxlen=STRAGGLER_WINDOW)
        self.last_beat = clock()
        self.steps = 0
        self.step = guard.step_number
        self._forward_seen = False
        self._lagging: dict[int, int] = {}
        self._reported_stragglers: dict[int, dict[str, Any]] = {}
        self.fired = False
        self._progress: tuple[int, float] = (-1, 0.0)  # step and time of the last progress.json
        self.polled = guard.optimizer is None
        self._stop = threading.Event()
        self.heartbeats: Heartbeats | None = None
        if self.world_size > 1 and "MASTER_ADDR" in env and "MASTER_PORT" in env:
            try:
                self.heartbeats = Heartbeats(self.rank, self.world_size, env)
            except Exception as exc:  # no store to reach: each rank judges itself alone
                say(f"sentinel: watchdog heartbeats unavailable ({exc!r})")
        self._step_handle: Any = None
        # Made in the training thread (the guard's): its work, between steps too, is no hang.
        self.activity = Activity(threading.get_native_id(), _device_of(guard))
        self.last_active = self.last_beat
        # The other ranks' steps at the last look, and when one last moved (``_peers_moved``).
        self._peer_steps: dict[int, int] | None = None
        self.peers_active = self.last_beat
        self.thread = threading.Thread(target=shielded(self._run), name="stabilizer-watchdog", daemon=True)

    def follow(self, optimizer: Any, handles: list[Any]) -> None:
        """Beat at ``optimizer``'s steps (the guard's handles hold the hook); a second call moves the hook
        to the optimizer that replaced the first (Guard.hand_over)."""
        if self._step_handle is not None:
            self._step_handle.remove()
            with contextlib.suppress(ValueError):
                handles.remove(self._step_handle)
        with handle_ids.apart():
            self._step_handle = optimizer.register_step_post_hook(self.after_step)
        handles.append(self._step_handle)

    # -- what the training thread calls, through hooks (cheap: a clock read and an append)
    def after_step(self, *_: Any) -> None:
        """The optimizer's step post hook: a step was taken."""
        self.beat(self.guard.step_number)

    def beat(self, step: int) -> None:
        now = self.clock()
        if self.steps:
            self.intervals.append(now - self.last_beat)
        self.last_beat, self.step, self.steps = now, step, self.steps + 1
        self._forward_seen = False

    def forward_done(self) -> None:
        """The first forward pass after a step ended (its backward pass starts): the rank's own busy time
        since that step."""
        if not self._forward_seen:
            self._forward_seen = True
            if self.steps:
                self.busy.append(self.clock() - self.last_beat)

    # -- the thread
    def start(self) -> Watchdog:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    remove = stop  # the guard removes its hooks, this one among them, when it closes or stops

    @property
    def median_step(self) -> float | None:
        return statistics.median(self.intervals) if len(self.intervals) >= 2 else None

    def _beat_record(self) -> dict[str, Any]:
        busy = statistics.median(self.busy) if len(self.busy) >= min(5, STRAGGLER_WINDOW) else None
        return {"step": self.guard.step_number, "forward": self._forward_seen, "wall": time.time(),
                "host": self.host, "busy": busy, "steps": self.steps}

    def _run(self) -> None:
        while not self._stop.wait(self.bounds.tick):
            if self.polled and self.guard.step_number != self.step:
                self.beat(self.guard.step_number)  # no optimizer to hook: steps seen at tick granularity
            if self.heartbeats is not None:
                try:
                    self.heartbeats.publish(self._beat_record())
                    if self.rank == 0 and self.bounds.straggler_factor > 0 and not self.guard.apart:
                        self._check_stragglers(self.heartbeats.read())
                except Exception:  # the store went away (the job is ending): judge alone from now on
                    self.heartbeats = None
            if self.guard.primary:
                self._write_progress()
            if self.activity.worked():
                self.last_active = self.clock()
            now = self.clock()
            limit = self.bounds.limit(self.median_step)
            idle = now - max(self.last_beat, self.last_active, self.peers_active)
            if idle > limit / 2 and self._peers_moved():
                self.peers_active = now
            elif idle > limit and not self.fired:
                self.fired = True
                self._hang(now - self.last_beat, limit)

    def _peers_moved(self) -> bool:
        """Whether another rank's step moved since the last look (read only once this rank has been idle for half
        its bound, so a healthy job reads nothing more). A rank that waits while another trains on (rank 0 alone
        after the ranks' DDP training, the others at the script's barrier) is no hang of the job: before stop 76,
        the waiting rank's watchdog called one once the phase alone outlasted its bound, and the job was ended. In
        lockstep no rank moves while another is stuck; ranks that step apart (a sweep) are judged when none moves."""
        if self.heartbeats is None:
            return False
        try:
            beats = self.heartbeats.read()
        except Exception:
            return False
        steps = {rank: int(beat["step"]) for rank, beat in beats.items() if rank != self.rank}
        seen, self._peer_steps = self._peer_steps, steps
        return seen is not None and any(seen.get(rank, step) != step for rank, step in steps.items())

    def _write_progress(self) -> None:
        step, written = self._progress
        now = self.clock()
        if self.step != step and self.steps and now - written >= min(PROGRESS_EVERY, self.bounds.floor / 2):
            from stabilizer_sentinel.capture import store

            path = self.guard.sentinel.findings_path.with_name(PROGRESS_FILE)
            with contextlib.suppress(OSError):
                store.write_json_atomic(path, {"version": 1, "step": self.step, "time": time.time()})
                self._progress = (self.step, now)

    # -- a hang
    def describe(self, idle: float, limit: float, beats: Mapping[int, Mapping[str, Any]]) -> tuple[str, list[int]]:
        median = self.median_step
        why = (f"max(floor {self.bounds.floor:g} s, {self.bounds.factor:g} x median step {median:.3g} s)"
               if median is not None else f"startup bound {max(self.bounds.startup, self.bounds.floor):g} s")
        behind = laggards(beats, now=time.time(), stale_after=3 * self.bounds.tick + 5)
        text = f"no optimizer step for {idle:.1f} s on rank {self.rank} ({self.host}), bound {limit:.1f} s = {why}"
        if self.last_active > self.last_beat:  # it worked for a while after its last step
            text += f", the training thread idle for {self.clock() - self.last_active:.1f} s"
        if behind:
            named = ", ".join(f"rank {r} on {beats[r].get('host', '?')} at step {beats[r]['step']}"
                              f"{'' if beats[r].get('forward') else ' (before its forward pass)'}" for r in behind)
            text += f"; held up by {named}"
        return text, behind

    def _hang(self, idle: float, limit: float) -> None:
        beats: dict[int, dict[str, Any]] = {}
        if self.heartbeats is not None:
            try:
                beats = self.heartbeats.read()
            except Exception:
                beats = {}
        message, behind = self.describe(idle, limit, beats)
        guard = self.guard
        step = guard.step_number
        sentinel = guard.sentinel
        if not guard.primary:  # rank 0's is said where the sentinel records it (``Sentinel.report``): once
            say(f"sentinel: {HANG} at step {step}: {message}")
        if guard.primary:
            from stabilizer_sentinel.rules import RuleFinding

            context = {"epoch": guard.epoch, "phase": guard.phase, "learning_rate": guard.learning_rate}
            tensor = f"steps/rank{behind[0]}" if behind else f"steps/rank{self.rank}"
            sentinel.report(RuleFinding(HANG, step, tensor, round(idle, 3), message), context, source="watchdog")
            if self.heartbeats is not None:
                with contextlib.suppress(Exception):
                    self.heartbeats.mark_reported()
        elif self.heartbeats is not None:
            # Give rank 0 the time to record the finding before this rank's exit ends the job.
            with contextlib.suppress(Exception):
                self.heartbeats.wait_reported(REPORT_WAIT_SECONDS)
        if sentinel.action != "stop":
            return
        self._exit(f"{HANG} at step {step}: {message}", beats)

    def _exit(self, reason: str, beats: Mapping[int, Mapping[str, Any]]) -> None:
        sentinel = self.guard.sentinel
        try:
            if self.guard.primary and sentinel.summary is not None:
                sentinel.write(ended="rule_stop")
            if sentinel.failure_file is not None:
                sentinel.failure_file.parent.mkdir(parents=True, exist_ok=True)
                partial = sentinel.failure_file.with_name(f".{sentinel.failure_file.name}.{os.getpid()}")
                partial.write_text(f"RuleStop: {reason}\n")
                partial.replace(sentinel.failure_file)
        finally:
            say(f"sentinel stopped the job: RuleStop: {reason}")
            sys.stdout.flush()
            self._leave_together(beats)
            os._exit(EXIT_HANG)  # the training thread is stuck: only the process can end

    def _leave_together(self, beats: Mapping[int, Mapping[str, Any]]) -> None:
        """Every rank ends by its own watchdog, with its own failure line: the others say they are
        leaving, and rank 0, whose exit makes torchrun end the rest, leaves last. A rank whose heartbeat
        stopped (a dead process) is not waited for."""
        if self.heartbeats is None:
            return
        with contextlib.suppress(Exception):
            if not self.guard.primary:
                self.heartbeats.mark_left()
                return
            now, stale_after = time.time(), 3 * self.bounds.tick + 5
            alive = [rank for rank, beat in beats.items()
                     if rank != self.rank and now - float(beat["wall"]) <= stale_after]
            self.heartbeats.wait_left(alive, REPORT_WAIT_SECONDS)

    # -- stragglers (rank 0)
    def _check_stragglers(self, beats: Mapping[int, Mapping[str, Any]]) -> None:
        slow = stragglers(beats, self.bounds.straggler_factor)
        self._lagging = {rank: self._lagging.get(rank, 0) + 1 for rank in slow}
        for rank, ticks in self._lagging.items():
            if ticks >= STRAGGLER_TICKS and rank not in self._reported_stragglers:
                beat = beats[rank]
                entry = {"rule": STRAGGLER, "rank": rank, "host": beat.get("host"), "step": int(beat["step"]),
                         "factor": round(slow[rank], 2), "busy_seconds": beat.get("busy"),
                         "message": f"rank {rank} on {beat.get('host')} is {slow[rank]:.1f}x slower than the "
                                    f"median of the other ranks (busy {float(beat['busy']):.3g} s a step)"}
                self._reported_stragglers[rank] = entry
                say(f"sentinel: {STRAGGLER}: {entry['message']}")
                self._write_stragglers()

    def _write_stragglers(self) -> None:
        from stabilizer_sentinel.capture import store

        path = self.guard.sentinel.findings_path.with_name(STRAGGLERS_FILE)
        store.write_json_atomic(path, {"version": 1, "stragglers": list(self._reported_stragglers.values())})


def _device_of(guard: Any) -> Any:
    """The device of the guard's model's first parameter (None without one)."""
    try:
        return next(iter(guard.model.parameters())).device
    except (StopIteration, AttributeError, TypeError):
        return None


def start(guard: Any, environ: Mapping[str, str] | None = None) -> Watchdog | None:
    """The watchdog for ``guard``, started and hooked (removed with the guard's hooks); None when off."""
    bounds = HangBounds.from_env(environ)
    if not bounds.enabled:
        return None
    dog = Watchdog(guard, bounds, environ=environ)
    # The forward pass has ended when the backward pass starts: a listener, not a hook on the script's model.
    guard._handles.append(bare_tensors.listen(lambda _tensors: dog.forward_done()))
    if guard.optimizer is not None:
        dog.follow(guard.optimizer, guard._handles)
    guard._handles.append(dog)
    return dog.start()
