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
segment of its process (`journal-<database tag>-<pid>-<n>.jsonl`), one `write` each, without fsync:
the page cache outlives a killed process (SIGKILL, an OOM kill), so a record that was still waiting
in the writer's memory is not lost with it. A segment is deleted once all its records are saved (or
spooled), the current one emptied; the writer starts a new one with each batch it takes (an empty
one left at exit is removed by the next writer that looks). Its process holds an exclusive `flock`
on each segment for as long as the segment lives, so a segment whose lock is free belongs to a process
that is gone (whatever its pid now names): the next writer to look replays it like an orphaned spool.
"""

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection

from proxy.exchange import AttemptLog, Exchange

log = logging.getLogger("gateway")

_DATETIMES = ("started_at", "finished_at", "first_output_at")


def encode(exchange: Exchange) -> str:
    fields = dataclasses.asdict(exchange)
    for name in _DATETIMES:
        value = fields[name]
        fields[name] = value.isoformat() if value is not None else None
    return json.dumps(fields, separators=(",", ":"))


def decode(line: str) -> Exchange:
    fields = json.loads(line)
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
        db = connection.settings_dict
        where = f"{db.get('ENGINE')}|{db.get('HOST')}|{db.get('PORT')}|{db.get('NAME')}"
        return hashlib.sha256(where.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return self.directory / f"ledger-{self.database_tag()}-{os.getpid()}.jsonl"

    def append(self, exchanges: list[Exchange]) -> None:
        """Append and make durable (fsync) before returning; raises OSError if the disk refuses."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = "".join(encode(x) + "\n" for x in exchanges).encode()
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
        for path in self._files():
            try:
                spool = open(path, "rb+")  # noqa: SIM115 - closed by the with below
            except FileNotFoundError:
                continue  # another process replayed it (or its owner saved it) since it was listed
            with spool:
                try:
                    fcntl.flock(spool, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another process is replaying it
                lines = [line for line in spool.read().decode().splitlines() if line.strip()]
                exchanges = []
                for line in lines:
                    try:
                        exchanges.append(decode(line))
                    except (ValueError, TypeError, KeyError):
                        log.error("ledger spool: an unreadable record in %s was skipped", path.name)
                for start in range(0, len(exchanges), batch):
                    write(exchanges[start : start + batch])
                # Only this process appends to its own file, from this same writer thread, and no
                # one to a journal whose lock was free, so nothing can be appended between the read
                # above and the removal (a journal its owner removed meanwhile is gone already).
                path.unlink(missing_ok=True)
                replayed += len(exchanges)
        return replayed


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


class Journal:
    """The records this process has submitted and not saved yet, in its journal segments (see the
    module's docstring). `add` returns the segment a record went to; `saved` counts it out of it."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self._lock = threading.Lock()
        self._pid = 0
        self._next = 0
        self._current: int | None = None  # the segment `add` appends to
        self._open: dict[int, tuple[int, Path]] = {}  # segment -> (descriptor, path)
        self._pending: dict[int, int] = {}  # segment -> records not saved yet

    def add(self, exchange: Exchange) -> int | None:
        """Append the record (one write, no fsync); None when the disk refused it (logged, the
        record then lives in memory only, as it did before the journal)."""
        line = (encode(exchange) + "\n").encode()
        with self._lock:
            try:
                if self._pid != os.getpid():  # a forked child holds none of its parent's locks
                    self._pid, self._current, self._open, self._pending = os.getpid(), None, {}, {}
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

    def saved(self, segment: int | None) -> None:
        if segment is None:
            return
        with self._lock:
            if segment not in self._pending:
                return
            self._pending[segment] -= 1
            if self._pending[segment]:
                return
            if segment == self._current:
                try:
                    os.ftruncate(self._open[segment][0], 0)  # every record in it is saved
                except OSError:
                    log.exception("ledger journal: a saved segment could not be emptied")
            else:
                self._close(segment)

    def _start(self) -> None:
        directory = self.spool.directory
        directory.mkdir(parents=True, exist_ok=True)
        segment, self._next = self._next, self._next + 1
        path = directory / f"journal-{self.spool.database_tag()}-{self._pid}-{segment}.jsonl"
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
