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
"""

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection

from proxy.relay import AttemptLog, Exchange

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
        if not self.directory.is_dir():
            return []
        mine = self.path
        files = []
        for path in sorted(self.directory.glob(f"ledger-{self.database_tag()}-*.jsonl")):
            try:
                pid = int(path.stem.rpartition("-")[2])
            except ValueError:
                continue
            if path == mine or not _alive(pid):
                files.append(path)
        return files

    def replay(self, write: Callable[[list[Exchange]], None], batch: int = 200) -> int:
        """Write every spooled record (idempotently, through `write`) and remove each file once it
        is all in the database. Returns how many records were replayed; a database error propagates
        and leaves the file for the next attempt."""
        replayed = 0
        for path in self._files():
            with open(path, "rb+") as spool:
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
                # Only this process appends to its own file, from this same writer thread, so
                # nothing can be appended between the read above and the removal.
                path.unlink()
                replayed += len(exchanges)
        return replayed
