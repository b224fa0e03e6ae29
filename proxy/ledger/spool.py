"""The ledger's local spool (SPEC §7.3, issue #13): while the database is unreachable, finished
exchanges are appended to a local file instead of being lost, and replayed when it returns.

- One append-only JSON-lines file per process and database (`ledger-<database tag>-<pid>.jsonl` in
  GATEWAY_LEDGER_SPOOL_DIR);
  every append is flushed and fsync'ed before the writer lets go of the batch, so a crash after it
  loses nothing. A record holds what the ledger holds (ids, outcomes, counts), never content.
- Replay is idempotent by request id (`request_records_write(idempotent=True)` skips ids already
  stored, e.g. a batch whose commit reached the database but whose acknowledgement did not), so a
  replay interrupted half-way is simply run again.
- A process replays its own file, and the files of processes that are gone (a crash, a restart), each
  under an exclusive `flock` so two replayers never take the same file at once.

The journal (`Journal`, issue 21): every record is also appended, as it is submitted, to a journal
segment of its process (`journal-<database tag>-<pid>-<token>-<n>.jsonl`), one `write` each, without fsync:
the page cache outlives a killed process (SIGKILL, an OOM kill), so a record that was still waiting
in the writer's memory is not lost with it. A segment is emptied once all its records are saved (or
spooled) and kept for reuse (a few; more are deleted); the writer moves to another segment with each
batch it takes (empty ones left at exit are removed by the next writer that looks). Its process holds
an exclusive `flock` on each segment for as long as the segment lives, so a segment whose lock is free
belongs to a process that is gone (whatever its pid now names): the next writer to look replays it
like an orphaned spool.

Budget holds (SPEC §7.4, issue 21): before a request asks for part of its key's budget, the journal
gets a `held` line (the exchange as it is then), kept until the request's record is saved (a late
reservation whose give-back failed: kept until the process is gone, the record being settled maybe
before it; the replay then releases the hold of a request already recorded, charging nothing). A dead
process's segments are replayed together: a hold whose request has no record there (its process died
with the request in flight) becomes that request's record, outcome `gateway_lost`, which settles what
the database holds for it (`pools.BudgetHold`: nothing when the reservation never committed) as its
cost (usage never arrived) through the same idempotent write, so a replay run twice settles it once.
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import orjson
from django.conf import settings

from proxy.ledger.exchange import AttemptLog, Exchange
from routing.policy.vocabulary import Outcome
from runtime import fastjson, rawsql

log = logging.getLogger("gateway")

_DATETIMES = ("started_at", "finished_at", "first_output_at")


_EXCHANGE_FIELDS = tuple(f.name for f in dataclasses.fields(Exchange))
_ATTEMPT_FIELDS = tuple(f.name for f in dataclasses.fields(AttemptLog))


def encode(exchange: Exchange, *, held: bool = False) -> bytes:
    """One JSON line: what `dataclasses.asdict` gives, datetimes in ISO 8601. A record (every request's,
    journaled as it is submitted) is orjson's own encoding of the dataclass, which is that, in half the
    time of reading it field by field; a hold, and a record orjson refuses, are read field by field
    (never by `asdict`, whose deep copy of each value cost about 0.4 ms of the event loop a request)."""
    if not held:
        with contextlib.suppress(TypeError):  # an integer beyond 64 bits: read one by one below
            return orjson.dumps(exchange)
    fields = {name: getattr(exchange, name) for name in _EXCHANGE_FIELDS}
    fields["attempts"] = [{name: getattr(a, name) for name in _ATTEMPT_FIELDS} for a in exchange.attempts]
    for name in _DATETIMES:
        value = fields[name]
        fields[name] = value.isoformat() if value is not None else None
    if held:
        fields["held"] = True  # a budget hold, not a record (see the module's docstring)
    return fastjson.dumps(fields)


def decode(line: bytes | str) -> Exchange:
    return _decode(fastjson.loads(line))


def _decode(fields: dict) -> Exchange:
    for name in _DATETIMES:
        value = fields[name]
        fields[name] = datetime.fromisoformat(value) if value is not None else None
    fields["attempts"] = [AttemptLog(**a) for a in fields["attempts"]]
    known = {f.name for f in dataclasses.fields(Exchange)}
    return Exchange(**{k: v for k, v in fields.items() if k in known})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    """The spool of GATEWAY_LEDGER_SPOOL_DIR (read at each use, so tests and servers can point it
    elsewhere after import)."""

    @property
    def directory(self) -> Path:
        return Path(settings.GATEWAY_LEDGER_SPOOL_DIR)

    @staticmethod
    def database_tag() -> str:
        """Which database the records are for: a spool directory shared by gateways of different
        databases (tests, staging next to production) never replays one's records into another."""
        db = rawsql.backend().settings_dict
        where = f"{db.get('ENGINE')}|{db.get('HOST')}|{db.get('PORT')}|{db.get('NAME')}"
        return hashlib.sha256(where.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return self.directory / f"ledger-{self.database_tag()}-{os.getpid()}.jsonl"

    def append(self, exchanges: list[Exchange]) -> None:
        """Append and make durable (fsync) before returning; raises OSError if the disk refuses."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = b"".join(encode(x) + b"\n" for x in exchanges)
        with open(self.path, "ab") as spool:
            fcntl.flock(spool, fcntl.LOCK_EX)
            spool.write(data)
            spool.flush()
            os.fsync(spool.fileno())

    def pending(self) -> bool:
        return any(self._files())

    def _files(self) -> list[Path]:
        """This process's spool, the spools of processes that are gone, and orphaned journals."""
        if not self.directory.is_dir():
            return []
        mine = self.path
        tag = self.database_tag()
        files = []
        for path in sorted(self.directory.glob(f"ledger-{tag}-*.jsonl")):
            try:
                pid = int(path.stem.rpartition("-")[2])
            except ValueError:
                continue
            if path == mine or not _alive(pid):
                files.append(path)
        files += [path for path in sorted(self.directory.glob(f"journal-{tag}-*.jsonl")) if _orphaned(path)]
        return files

    def replay(self, write: Callable[[list[Exchange]], None], batch: int = 200) -> int:
        """Write every spooled record (idempotently, through `write`) and remove each file once it
        is all in the database. Returns how many records were replayed; a database error propagates
        and leaves the file for the next attempt."""
        replayed = 0
        units: dict[str, list[Path]] = {}  # a spool file alone; a dead journal's segments together
        for path in self._files():
            owner = path.stem.rpartition("-")[0] if path.name.startswith("journal-") else path.stem
            units.setdefault(owner, []).append(path)
        for paths in units.values():
            with contextlib.ExitStack() as held:
                files = []
                for path in paths:
                    try:
                        files.append(held.enter_context(open(path, "rb+")))
                        fcntl.flock(files[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except FileNotFoundError:
                        continue  # another process replayed it (or its owner saved it) since listed
                    except BlockingIOError:
                        break  # another process is replaying it
                else:
                    exchanges = _replayable(b"".join(f.read() for f in files), paths[0].name)
                    for start in range(0, len(exchanges), batch):
                        write(exchanges[start : start + batch])
                    # Only this process appends to its own file, from this same writer thread, and
                    # no one to a journal whose lock was free, so nothing can be appended between the
                    # read above and the removal (a journal its owner removed meanwhile is gone).
                    for path in paths:
                        path.unlink(missing_ok=True)
                    replayed += len(exchanges)
        return replayed


def _replayable(data: bytes, name: str) -> list[Exchange]:
    """The records of one spool file or one dead process's journal, and a `gateway_lost` record for
    each budget hold whose request has none there."""
    records: list[Exchange] = []
    holds: dict[str, Exchange] = {}
    # Lines of bytes: a torn last line may end inside a character, and a line may hold U+2028, which
    # str.splitlines would split at (runtime.fastjson).
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            fields = fastjson.loads(line)
            exchange = _decode(fields)
        except (ValueError, TypeError, KeyError):
            log.error("ledger spool: an unreadable record in %s was skipped", name)
            continue
        if fields.get("held"):
            holds[exchange.request_id] = exchange  # the latest hold: what it reserved in all
        else:
            records.append(exchange)
    for request_id in {x.request_id for x in records}:
        holds.pop(request_id, None)
    for lost in holds.values():  # its client saw the connection close: no status, no end
        lost.outcome, lost.status_code, lost.finished_at = Outcome.GATEWAY_LOST, None, None
        lost.reserving = True
    return records + list(holds.values())


def _orphaned(path: Path) -> bool:
    """Whether no process holds the journal segment's lock (its writer is gone)."""
    try:
        with open(path, "rb") as segment:
            fcntl.flock(segment, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except BlockingIOError:
        return False
    except FileNotFoundError:
        return False


# Saved segments kept for reuse: a new file per batch (create, lock, then unlink and close) was about
# 2 % of the event loop's GIL samples at c=16 (py-spy --gil); an emptied one is as good as new.
FREE_SEGMENTS = 4


class Journal:
    """The records this process has submitted and not saved yet, in its journal segments (see the
    module's docstring). `add` returns the segment a record went to; `saved` counts it out of it."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self._lock = threading.Lock()
        self._pid = 0
        self._owner = ""  # pid and a random token: a restarted process may be given a dead one's pid
        self._next = 0
        self._current: int | None = None  # the segment `add` appends to
        self._open: dict[int, tuple[int, Path]] = {}  # segment -> (descriptor, path)
        self._free: list[int] = []  # saved segments, emptied, kept open and locked for `_start`
        self._pending: dict[int, int] = {}  # segment -> records and holds not saved yet
        self._holds: dict[str, list[int]] = {}  # request id -> the segments of its holds

    def add(self, exchange: Exchange) -> int | None:
        """Append the record (one write, no fsync); None when the disk refused it (logged, the
        record then lives in memory only, as it did before the journal)."""
        return self._append(encode(exchange))

    def hold(self, exchange: Exchange, *, lasting: bool = False) -> None:
        """Note that the request holds (or is about to hold) part of its key's budget, until its record
        is saved; `lasting`: until this process is gone (a hold its record may already have missed)."""
        segment = self._append(encode(exchange, held=True))
        if segment is not None and not lasting:
            with self._lock:
                self._holds.setdefault(exchange.request_id, []).append(segment)

    def _append(self, text: bytes) -> int | None:
        line = text + b"\n"
        with self._lock:
            try:
                if self._pid != os.getpid():  # a forked child holds none of its parent's locks
                    self._pid, self._current, self._open, self._pending = os.getpid(), None, {}, {}
                    self._free = []
                    self._owner, self._holds = f"{self._pid}-{secrets.token_hex(4)}", {}
                if self._current is None:
                    self._start()
                assert self._current is not None
                os.write(self._open[self._current][0], line)
            except OSError:
                log.exception("ledger journal: a record could not be journaled")
                return None
            self._pending[self._current] += 1
            return self._current

    def rotate(self) -> None:
        """Later records go to a new segment, so the current one can be deleted once saved."""
        with self._lock:
            if self._current is not None and self._pending[self._current]:
                self._current = None
            # The old segment stays open (and locked) until its records are saved.

    def saved(self, request_id: str, segment: int | None) -> None:
        """The request's record is saved (or spooled): it and its holds leave their segments."""
        with self._lock:
            segments = self._holds.pop(request_id, [])
            for one in [*segments, segment] if segment is not None else segments:
                if one not in self._pending:
                    continue
                self._pending[one] -= 1
                if self._pending[one]:
                    continue
                try:
                    os.ftruncate(self._open[one][0], 0)  # everything in it is saved
                except OSError:
                    log.exception("ledger journal: a saved segment could not be emptied")
                    if one != self._current:
                        self._close(one)
                    continue
                if one != self._current:
                    if len(self._free) < FREE_SEGMENTS:
                        self._free.append(one)
                    else:
                        self._close(one)

    def _start(self) -> None:
        directory = self.spool.directory
        name = f"journal-{self.spool.database_tag()}-{self._owner}-"
        while self._free:
            segment = self._free.pop()
            path = self._open[segment][1]
            if path.parent == directory and path.name.startswith(name):
                self._current = segment
                return
            self._close(segment)  # the spool directory or the database changed (tests do): not theirs
        directory.mkdir(parents=True, exist_ok=True)
        segment, self._next = self._next, self._next + 1
        path = directory / f"{name}{segment}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._current, self._open[segment], self._pending[segment] = segment, (fd, path), 0

    def _close(self, segment: int) -> None:
        fd, path = self._open.pop(segment)
        del self._pending[segment]
        try:
            path.unlink(missing_ok=True)  # unlinked while locked: no replayer takes a saved segment
        finally:
            os.close(fd)
