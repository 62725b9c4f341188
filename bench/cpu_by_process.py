"""Run a command and print the CPU time (user + sys) of it and every process it starts,
by role, as the benchmarks on a shared box report it.

    .venv/bin/python bench/cpu_by_process.py .venv/bin/python bench/e2e.py --reports 8000000

Every 0.1 s it reads ``/proc/PID/stat`` of the command's descendants and keeps each
one's last reading (a process's final 0.1 s can be missed; the daemons idle then).
Roles: ``clients`` (multiprocessing children), ``shuffler``, ``aggregator`` (with the
children they reaped), ``redis(shuffler)`` / ``redis(aggregator)`` (the redis-server a
daemon's ``--redis`` names), ``AOF rewrites`` (the children a redis-server reaped),
``bench main`` (the command itself), ``other``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def read(pid: int) -> tuple[int, float, float, str] | None:
    """Parent, own CPU s, reaped children's CPU s, command line; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[1]), (utime + stime) / TICK, (cutime + cstime) / TICK, cmd


def sample(root: int, child: subprocess.Popen[bytes]) -> dict[int, tuple[float, float, str]]:
    inside, outside = {root}, set()
    last: dict[int, tuple[float, float, str]] = {}
    while child.poll() is None:
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in outside:
                continue
            pid = int(name)
            got = read(pid)
            if got is None:
                continue
            ppid, own, reaped, cmd = got
            if pid not in inside:
                if ppid not in inside:
                    outside.add(pid)
                    continue
                inside.add(pid)
            if not cmd and pid in last:  # a zombie: keep the command line seen
                cmd = last[pid][2]
            last[pid] = (own, reaped, cmd)
        time.sleep(0.1)
    return last


def by_role(root: int, last: dict[int, tuple[float, float, str]]) -> dict[str, float]:
    redis_role = {}
    for _, _, cmd in last.values():
        m = re.search(r"(shuffler|aggregator) serve.*--redis redis://127\.0\.0\.1:(\d+)", cmd)
        if m:
            redis_role[m.group(2)] = f"redis({m.group(1)})"
    roles: dict[str, float] = {}
    for pid, (own, reaped, cmd) in last.items():
        exe = cmd.split(" ")[0]
        if "redis-server" in exe:  # its title: "redis-server 127.0.0.1:PORT"
            port = cmd.split(":")[-1].split()[0] if ":" in cmd else "?"
            parts = [(redis_role.get(port, "redis(?)"), own), ("AOF rewrites", reaped)]
        elif "redis-" in exe:
            continue  # a rewrite child: in its parent's reaped time
        elif "shuffler serve" in cmd:
            parts = [("shuffler", own + reaped)]
        elif "aggregator serve" in cmd:
            parts = [("aggregator", own + reaped)]
        elif "spawn_main" in cmd:
            parts = [("clients", own)]
        elif pid == root:
            parts = [("bench main", own)]  # its reaped time is the processes above
        else:
            parts = [("other", own)]
        for role, seconds in parts:
            roles[role] = roles.get(role, 0.0) + seconds
    return roles


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip().splitlines()[3].strip() if __doc__ else "COMMAND ...")
        return 2
    child = subprocess.Popen(sys.argv[1:])
    last = sample(child.pid, child)
    code = child.wait()
    roles = by_role(child.pid, last)
    print(
        "CPU s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(roles.items()))
        + f"; total {sum(roles.values()):.1f}; load {os.getloadavg()[0]:.2f}"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
