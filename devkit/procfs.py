"""What the harness can see of a process from outside (/proc, Linux).

- `inventory(pid)`: the process's file descriptors, sockets by kind and TCP state, threads and RSS;
  `tree_inventory(pid)` sums it over the process and its children (a node's supervisor and workers).
- `cpu_seconds(pid)`, `rss_kb`, `peak_rss_kb` / `peak_rss_reset`, `children(pid)`.
"""

from __future__ import annotations

import contextlib
import glob
import os
from dataclasses import dataclass
from pathlib import Path

TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


@dataclass(frozen=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: str


@dataclass(frozen=True)
class Inventory:
    fds: int
    sockets: int  # every socket fd (TCP, unix, netlink...)
    tcp: tuple[TcpSocket, ...]
    threads: int
    rss_kb: int

    def tcp_excluding(self, db_port: int | None) -> list[TcpSocket]:
        """TCP sockets that are not listening and not to the database server."""
        return [s for s in self.tcp if s.state != "LISTEN" and (db_port is None or s.remote_port != db_port)]

    def non_db_sockets(self, db_port: int | None) -> int:
        return self.sockets - sum(1 for s in self.tcp if db_port is not None and s.remote_port == db_port)


def _tcp_table(pid: int) -> dict[str, TcpSocket]:
    table: dict[str, TcpSocket] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            local_port, remote_port = int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)
            table[inode] = TcpSocket(local_port, remote_port, TCP_STATES.get(state, state))
    return table


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_kb(pid: int) -> int:
    return _status_field(pid, "VmRSS")


def peak_rss_reset(pid: int) -> None:
    """Start a new peak: the kernel's high-water mark of the resident set (VmHWM) is set back to the
    current RSS (Linux, clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rss_kb(pid: int) -> int:
    """The largest resident set since the process started or since `peak_rss_reset`."""
    return _status_field(pid, "VmHWM")


def _status_field(pid: int, name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """The process's descendants, from /proc (children before grandchildren)."""
    parents: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def tree_inventory(pid: int) -> Inventory:
    """`inventory` summed over the process and its descendants (a node's supervisor and workers)."""
    parts = []
    for one in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            parts.append(inventory(one))
    return Inventory(
        sum(i.fds for i in parts),
        sum(i.sockets for i in parts),
        tuple(s for i in parts for s in i.tcp),
        sum(i.threads for i in parts),
        sum(i.rss_kb for i in parts),
    )


def inventory(pid: int) -> Inventory:
    table = _tcp_table(pid)
    fds = sockets = 0
    tcp = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile
        fds += 1
        if target.startswith("socket:["):
            sockets += 1
            found = table.get(target[8:-1])
            if found is not None:
                tcp.append(found)
    return Inventory(fds, sockets, tuple(tcp), _status_field(pid, "Threads"), rss_kb(pid))
