"""The batches a training step took from the script's data loader, held so a rollback can replay them.

Attribution before acting (stabilizer_sentinel.recovery.recovery): a sudden explosion is replayed from
the restored state with the failing step's own batches first. When that step fails again and the
steps after it, on the loader's next batches, train at the same rate, the batch is bad (skipped: the
loop has moved past it; named in the decision, and skipped by a relaunch too); when it trains, the
explosion was a one-off; when the later steps fail too, the rate is at fault.

How the batches are met: ``torch.utils.data.DataLoader``'s iterators all hand out their batches through
one method (``_BaseDataLoaderIter.__next__``), and torch offers no hook there; while a ``Batches`` is
active (in-job recovery, or batches to skip) a stand-in under the method's name calls it. A
batch fetched with gradients on (a validation loop under ``no_grad`` is not training) counts for the
step under way; at each step's check the fetches of the dataset fetched last (the training data) are
held as that step's (a loop that fetches ahead: below), for the newest ``KEEP`` steps: references to
batches the loop already made, no copies (before the first step, the newest ``MOST`` fetched). Only the
thread that runs the steps counts (a thread fetching ahead for the loop does not). Where a step's
batches are not known and none is to be skipped, the stand-in is taken out after the second step.
Replaying one hands the held batch out at that dataset's next fetch, before the loader's own next
batch, so the data's order after it is the script's; a batch the loop wrote into since (``inputs[0] =
nan``, an in-place normalisation: its tensors' version counters moved) is not replayed, as it is no
longer what the loader made.

Only where a step's batches are known: from the second step on, each step must take the same number of
batches. A loop that fetches ahead (Accelerate's prepared loader, Lightning's where the data has no
length: each fetches a step's batch during the step before, to know whether that one is the last)
takes more before its first step, the same number after: the batches fetched and not yet trained on
(``lag``, at most a step's) are each step's next, oldest first, and a replay goes out where the loop
fetches the first batch of a step not yet begun (``lead`` steps after the rollback: the loop trains on
what it holds first). A peek at the data through another iterator before the first step
(``next(iter(loader))`` for a shape) is not the loop's. Not for a script that makes its batches
without a ``DataLoader`` (slices of a tensor), nor under DDP (each rank's batches are its own, and
skipping one on one rank would leave the ranks a step apart).

A relaunch skips the batches an earlier attempt found bad (``skip``, the configuration's
``skip_batches``): each training batch's ``fingerprint`` (its tensors' shapes, types and an evenly
strided sample of their values) is compared, and a match is passed over for the loader's next batch.
That finds the batch where the relaunch makes the same batches (a seeded order); a shuffle with another
seed puts the bad record in another batch, which is not found by its fingerprint (by its values, below,
where an earlier attempt found it a corrupt record: ``skip_nonfinite_batches``).

A bad batch whose non-finite values sit in a few of its records (at most half the rows of each tensor
that holds them), where the batches trained after it hold none (a corrupt record: NaN features), turns
on ``skip_nonfinite`` for its data: from then on each batch of that data with a non-finite value in a
floating tensor in host memory is passed over too, wherever a shuffle put the record (the tensors a
batch's tuples, lists and dicts hold, read through their smallest and largest values on the host, no
device synchronisation; a tensor the loader already put on an accelerator, or one of a layout that
cannot be read so, is not read). Data whose batches carry non-finite values by design (missing values
the network masks, a padding mask of -inf) is told apart by the rows that hold them and by the batches
after the bad one; where it passes for a corrupt record all the same, the skipping turns itself off
once it would pass over more than ``NONFINITE_SHARE`` of the batches fetched since (more than
``NONFINITE_LEAST`` of them): a corrupt record is in one batch of a pass.

This module must not change a batch, or the order of the batches the loop takes, unless asked to
replay or skip one.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import dataloader

from stabilizer_sentinel.say import say

KEEP = 3  # the newest steps whose batches are held
# The most batches one step may take and still be held: a loop that reads the data with gradients on
# before it trains (a pass to measure its mean, say) holds no more than this many until its first step.
MOST = 16
SAMPLE = 1024  # values of each tensor a fingerprint reads, evenly strided
NONFINITE_SHARE, NONFINITE_LEAST = 0.25, 3  # batches passed over for non-finite values before that stops
_ITERATOR = dataloader._BaseDataLoaderIter
_ORIGINAL = _ITERATOR.__next__
_ACTIVE: list[weakref.ref[Batches]] = []  # the one Batches the wrapped method serves, while any is


@dataclass(frozen=True)
class Fetch:
    """One batch a loader handed out: which data, which pass over it, its place in that pass (from 1)."""

    dataset: int
    batch: Any
    epoch: int
    index: int
    thread: int = 0  # the thread that fetched it
    source: int = 0  # the iterator it came from (``Batches._source``): a peek through another is not the loop's
    versions: tuple[int, ...] = ()  # its tensors' version counters then: an in-place write moves them


class Batches:
    """The training batches of the newest steps (``held``), a replay of some (``replay``), and the
    batches to pass over (``skip``: fingerprints)."""

    def __init__(self, skip: Iterable[str] = (), *, skip_nonfinite: bool = False) -> None:
        self.skip = set(skip)
        self.skip_nonfinite = skip_nonfinite  # pass over batches with non-finite values (``nonfinite``)
        self.nonfinite_data: set[int] | None = None  # ... of these data alone (None: all)
        self._nonfinite_seen = self._nonfinite_skipped = 0  # batches looked at and passed over since
        self.skipped = 0  # batches passed over
        self._since: list[Fetch] = []  # fetched since the last check (the newest ``MOST``)
        self._more = False  # ... and more than that
        self._held: dict[int, list[Fetch]] = {}
        self._checks = 0
        self._first = 0  # the first step's number
        self.per_step: int | None = None  # the batches each step takes, once known; 0: not known, none held
        self.lag = 0  # the batches a loop fetching ahead holds beyond the step under way
        self.lead = 0  # the steps the last replay comes after (``replay``)
        self._pending: list[Fetch] = []  # fetched and not yet a step's, oldest first (a loop fetching ahead)
        self._queue: list[Fetch] = []
        self._delay = 0  # the loop's own fetches still to go out before the replay (a loop fetching ahead)
        self._passes: dict[int, int] = {}
        self._thread: int | None = None  # the thread that runs the steps (the first check's)
        self._sources: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._iterators = 0

    # -- installing
    def activate(self) -> None:
        _ACTIVE[:] = [weakref.ref(self)]
        _ITERATOR.__next__ = _next

    def deactivate(self) -> None:
        if _ACTIVE and _ACTIVE[0]() in (self, None):
            _ACTIVE.clear()
            _ITERATOR.__next__ = _ORIGINAL

    # -- what the loader and the guard call
    def fetch(self, iterator: Any) -> Any:
        """The batch ``iterator`` hands out next: a replayed one first, then the loader's own, passing
        over those to skip."""
        dataset = id(getattr(iterator, "_dataset", iterator))  # torch's own attributes, read with care
        thread = threading.get_ident()
        ours = self._thread in (None, thread)  # a thread that fetches ahead for the loop is not the step's
        if ours and self._queue and self._queue[0].dataset == dataset and not self._delay:
            fetch = self._queue.pop(0)
            self._since.append(fetch)
            return fetch.batch
        if ours and self._queue and self._queue[0].dataset == dataset:
            self._delay -= 1  # a batch of the step the loop is fetching ahead for: its own
        while True:
            yielded = getattr(iterator, "_num_yielded", 0)
            fresh = getattr(iterator, "_sampler_iter", True) is None  # reset at this fetch
            if fresh or yielded == 0:  # a new pass over this data
                self._passes[dataset] = self._passes.get(dataset, 0) + 1
            index = 1 if fresh or not isinstance(yielded, int) else yielded + 1
            batch = _ORIGINAL(iterator)
            fetch = Fetch(dataset, batch, self._passes.get(dataset, 1), index, thread=thread,
                          versions=_versions(batch), source=self._source(iterator))
            if self.skip and fingerprint(batch) in self.skip:
                self.skipped += 1
                say(f"sentinel: skipped batch {fetch.index} of pass {fetch.epoch} over the training data: the same "
                    f"batch was found bad before")
                continue
            if self.skip_nonfinite and self._passed_over_nonfinite(fetch):
                continue
            if not ours or self.per_step == 0:
                return batch
            self._since.append(fetch)
            if len(self._since) > MOST:
                del self._since[0]
                self._more = True
            return batch

    def corrupt_records_in(self, data: Iterable[int]) -> None:
        """Pass over the batches of ``data`` (``Fetch.dataset``) that hold non-finite values from now on."""
        self.skip_nonfinite, self.nonfinite_data = True, set(data)
        self._nonfinite_seen = self._nonfinite_skipped = 0

    def _passed_over_nonfinite(self, fetch: Fetch) -> bool:
        """Whether ``fetch`` is passed over for its non-finite values; the skipping stops where it would pass
        over more than ``NONFINITE_SHARE`` of the batches (the data carries them by design)."""
        if not self.skip_nonfinite or (self.nonfinite_data is not None and fetch.dataset not in self.nonfinite_data):
            return False
        self._nonfinite_seen += 1
        if not nonfinite(fetch.batch):
            return False
        self._nonfinite_skipped += 1
        if self._nonfinite_skipped > max(NONFINITE_LEAST, NONFINITE_SHARE * self._nonfinite_seen):
            self.skip_nonfinite = False
            say(f"sentinel: {self._nonfinite_skipped} of the {self._nonfinite_seen} batches since hold non-finite "
                f"values: the data carries them, not one corrupt record; no longer passed over")
            return False
        self.skipped += 1
        say(f"sentinel: skipped batch {fetch.index} of pass {fetch.epoch} over the training data: it holds "
            f"non-finite values, as the bad batch found before did")
        return True

    def _source(self, iterator: Any) -> int:
        """A number for ``iterator``, its own while it lives (an id may be a dead iterator's again)."""
        try:
            number = self._sources.get(iterator)
            if number is None:
                self._iterators += 1
                number = self._sources[iterator] = self._iterators
            return number
        except TypeError:  # not weakly referable or hashable: one number for all
            return 0

    def checked(self, step: int) -> None:
        """Step ``step`` is checked: the batches fetched since the last check, of the data fetched last,
        are its own; where the loop fetches ahead, the oldest of those it fetched and has not trained on."""
        if self._thread is None:
            self._thread = threading.get_ident()
        since, more, self._since, self._more = self._since, self._more, [], False
        since = [f for f in since if f.thread == self._thread]
        training = [f for f in since if f.dataset == since[-1].dataset] if since and not more else []
        self._checks += 1
        if self._checks == 1:  # a peek through another iterator before the loop began is not the loop's
            self._pending = [f for f in training if f.source == training[-1].source]
            self._first = step
        elif self._checks == 2:  # a loop that fetches ahead takes more before its first step, the same after
            lag = len(self._pending) - len(training)
            self.per_step = len(training) if training and 0 <= lag <= len(training) and not more else 0
            if not self.per_step:
                self._pending = []
                if not self.skip and not self.skip_nonfinite:
                    self.deactivate()  # nothing to hold, nothing to pass over: the loaders as torch has them
            else:
                self.lag = lag
                self._take(self._first, [])
        if self._checks > 1 and self.per_step:
            self._take(step, training)
        for old in [s for s in self._held if s <= step - KEEP]:
            del self._held[old]

    def _take(self, step: int, fetched: list[Fetch]) -> None:
        """Step ``step``'s batches: the oldest ``per_step`` of those pending with ``fetched``, where no more
        than ``lag`` are left (else not known: a step that took fewer or more, the loop's last in a pass)."""
        pending = self._pending + fetched
        if self._pending and fetched and self._pending[-1].dataset != fetched[0].dataset:
            pending = fetched  # the loop moved to other training data
        extra = len(pending) - (self.per_step or 0)
        if 0 <= extra <= self.lag:
            self._held[step], self._pending = pending[:self.per_step], pending[self.per_step:]
        else:
            self._held.pop(step, None)
            self._pending = pending[len(pending) - self.lag:] if self.lag and extra > 0 else []


    def held(self, step: int) -> list[Fetch] | None:
        """The batches step ``step`` took, when known, still held and as the loader made them (a loop that
        wrote into its batch, ``inputs[0] = nan`` or an in-place normalisation, would have that replayed)."""
        fetches = self._held.get(step) if self.per_step else None
        if fetches is None or any(_versions(f.batch) != f.versions for f in fetches):
            return None
        return fetches

    def replay(self, fetches: list[Fetch]) -> None:
        """Hand ``fetches`` out again, at their data's next fetches for a step not yet begun: ``lead`` steps
        on, after the batches the loop fetched ahead and holds (none at the end of a pass)."""
        self._queue = list(fetches)
        ahead = len(self._pending)
        self.lead = 1 if ahead else 0
        self._delay = (self.per_step or 0) - ahead if ahead else 0

    def trained_after(self, step: int) -> list[Fetch]:
        """The batches held of the steps after ``step`` (the newest ``KEEP`` steps' at most)."""
        return [f for held, fetches in sorted(self._held.items()) if held > step for f in fetches]

    def replayed(self) -> bool:
        """Whether the last replay was handed out whole; a replay the loop did not take is dropped."""
        done = not self._queue
        self._queue, self._delay = [], 0
        return done


def describe(fetches: list[Fetch]) -> dict[str, Any]:
    """What findings.json says of a step's batches: where the first stands in the data, how many, and
    the fingerprint of each that has one."""
    first = fetches[0]
    prints = [fingerprint(f.batch) for f in fetches]
    return {"epoch": first.epoch, "index": first.index, "batches": len(fetches),
            "fingerprints": [p for p in prints if p is not None]}


def nonfinite(batch: Any) -> bool:
    """Whether a floating tensor of ``batch`` in host memory holds a NaN or an infinity (a tensor on an
    accelerator is not read: that would wait for the device)."""
    return any(not _finite(leaf) for leaf in _readable(batch))


def _readable(batch: Any) -> Iterable[torch.Tensor]:
    """The floating tensors of ``batch`` whose values can be read here: dense, in host memory."""
    for leaf in _leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu" and leaf.layout == torch.strided \
                and not leaf.is_nested and (leaf.is_floating_point() or leaf.is_complex()):
            yield leaf.detach()


def _finite(tensor: torch.Tensor) -> bool:
    """Whether every value is finite, read through the smallest and largest (a NaN carries into both, an
    infinity is one of them): one pass, nothing allocated; ``isfinite(...).all()`` builds a mask as large as
    the batch (4.3 ms against 106 ms for a float batch of 256 x 3 x 224 x 224 on this machine's 2 cores). A
    conjugate view is read as it resolves; a tensor that cannot be read so (a float8 type) counts as finite:
    it is not passed over."""
    try:
        values = _real(tensor)
        if values.numel() == 0:
            return True
        low, high = torch.aminmax(values)
        return bool(torch.isfinite(low) & torch.isfinite(high))
    except (RuntimeError, NotImplementedError, TypeError):
        return True


def corrupt_records(bad: list[Fetch], after: list[Fetch]) -> bool:
    """Whether the bad batches ``bad`` hold non-finite values in a few records and the batches trained after
    them, ``after`` (at least one), hold none: corrupt records, not what the data carries by design (missing
    values a network masks, a padding mask of -inf, which fill many rows or recur in other batches). A few:
    in each tensor that holds them, at most half its rows (along its first dimension)."""
    if not after or any(nonfinite(f.batch) for f in after):
        return False
    rows = [_nonfinite_rows(tensor) for f in bad for tensor in _readable(f.batch)]
    rows = [(spoiled, total) for spoiled, total in rows if spoiled]
    return bool(rows) and all(2 * spoiled <= total for spoiled, total in rows)


def _nonfinite_rows(tensor: torch.Tensor) -> tuple[int, int]:
    """(rows holding a non-finite value, rows) of ``tensor`` along its first dimension; a scalar is one row."""
    if _finite(tensor):
        return 0, max(tensor.shape[0] if tensor.dim() else 1, 1)
    flat = _real(tensor)
    flat = flat.reshape(flat.shape[0], -1) if flat.dim() else flat.reshape(1, 1)
    return int((~torch.isfinite(flat)).any(dim=1).sum()), flat.shape[0]


def _real(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values as real numbers: a complex one's parts side by side (a conjugate view resolved)."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


def fingerprint(batch: Any) -> str | None:
    """A short digest of a batch: each tensor's type, shape and ``SAMPLE`` of its values spread evenly
    over it (at fractional spacing, so a sample of token ids does not fall on one column); other
    leaves by their value (numbers, strings) or type. None when no tensor's values were read (a batch
    of another kind: every batch of its loader would read alike, and passing over one would pass over
    all)."""
    digest = hashlib.blake2b(digest_size=8)
    read = False
    for leaf in _leaves(batch):
        if isinstance(leaf, torch.Tensor):
            digest.update(f"{leaf.dtype}{tuple(leaf.shape)}".encode())
            try:
                flat = leaf.detach().reshape(-1)
                if flat.numel() > SAMPLE:
                    spread = torch.linspace(0, flat.numel() - 1, SAMPLE, dtype=torch.float64).long()
                    flat = flat[spread.to(flat.device)]
                digest.update(flat.cpu().contiguous().view(torch.uint8).numpy().tobytes())
                read = read or flat.numel() > 0
            except (RuntimeError, TypeError):  # a sparse or otherwise unreadable layout: its shape alone
                pass
        elif leaf is None or isinstance(leaf, str | int | float | bool | bytes):
            digest.update(repr(leaf).encode())
        else:
            digest.update(type(leaf).__qualname__.encode())
    return digest.hexdigest() if read else None


def _versions(batch: Any) -> tuple[int, ...]:
    return tuple(leaf._version for leaf in _leaves(batch) if isinstance(leaf, torch.Tensor))


def _leaves(value: Any) -> Iterable[Any]:
    if isinstance(value, Mapping):
        for key in value:
            yield key
            yield from _leaves(value[key])
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


@functools.wraps(_ORIGINAL)  # under torch's name, signature and documentation (docs/harmless.md)
def _next(iterator: Any) -> Any:
    batches = _ACTIVE[0]() if _ACTIVE else None
    if batches is None or not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return _ORIGINAL(iterator)
    return batches.fetch(iterator)
