"""How many torch threads a job uses: the cores no other process is busy on, re-checked as it runs.

A user's machine is never idle. torch's intra-op threads (OpenMP) split every operation evenly
and wait at its end for the slowest; when another process takes a core, one thread is
descheduled for a whole time slice while its sibling waits, and a job of 2 threads on 2 cores
beside one busy process ran x3 slower than alone, where 1 thread ran x1.4 slower
(results/bench/contention.md). So a job uses as many threads as there are cores that other
processes leave idle, never fewer than one and never more than its share (``cap``: cores /
n_jobs for jobs side by side), and looks again every ``interval`` seconds, so it takes a core
back when the other process ends and gives one up when another starts. (OpenMP's passive wait
policy, which stops the waiting thread from spinning, made a job alone x1.4 slower and did not
help beside a busy one; threads are the lever that works.)

Other processes' load comes from ``/proc/stat`` (the cores this process may run on) minus this
process's own CPU time over the same interval; a process using less than half a core does not
count. Where ``OMP_NUM_THREADS`` is set, or there is no ``/proc/stat`` (macOS, Windows), the
count is fixed as torch sets it. The count can change the last bits of a sum, so a run records
the threads of each logged step in metrics.jsonl (``threads``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Sample:
    """CPU time of the cores a process may use, and of the process itself (seconds)."""

    wall: float
    busy: float   # all processes on our cores
    own: float    # this process (every thread)


def allowed_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return list(range(os.cpu_count() or 1))


def read_sample(cores: list[int], stat: Path = STAT) -> Sample | None:
    """None where /proc/stat cannot be read."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    wanted, busy = {f"cpu{c}" for c in cores}, 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            ticks = [int(v) for v in fields[1:8]]  # user nice system idle iowait irq softirq
            busy += sum(ticks) - ticks[3] - ticks[4]
    hz = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return Sample(time.monotonic(), busy / hz, t.user + t.system)


def others_busy(before: Sample, after: Sample) -> float:
    """Cores other processes kept busy between two samples."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall


def choose(cores: int, others: float, cap: int | None = None) -> int:
    """Threads for a job on ``cores`` cores beside ``others`` busy cores: the idle ones, at
    least 1, at most ``cap``."""
    free = cores - int(others + 0.5)  # a process under half a core does not take one
    return max(1, min(free, cap or cores))


class ThreadPolicy:
    """Sets torch's thread count from the idle cores at :meth:`start` and every ``interval``
    seconds after (:meth:`tick`)."""

    def __init__(self, cap: int | None = None, interval: float = 10.0, first_look: float = 0.2):
        self.cores = allowed_cores()
        self.cap, self.interval, self.first_look = cap, interval, first_look
        self.fixed = bool(os.environ.get("OMP_NUM_THREADS")) or read_sample(self.cores) is None
        self.last: Sample | None = None

    def start(self) -> int:
        import torch

        if self.fixed:
            if self.cap:
                torch.set_num_threads(min(torch.get_num_threads(), self.cap))
            return torch.get_num_threads()
        before = read_sample(self.cores)
        time.sleep(self.first_look)  # this process idles: what is busy now is someone else
        self.last = read_sample(self.cores)
        return self._apply(others_busy(before, self.last))

    def tick(self) -> None:
        if self.fixed or self.last is None or time.monotonic() - self.last.wall < self.interval:
            return
        now = read_sample(self.cores)
        others, self.last = others_busy(self.last, now), now
        self._apply(others)

    def _apply(self, others: float) -> int:
        import torch

        threads = choose(len(self.cores), others, self.cap)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads


_active: ThreadPolicy | None = None


def activate(cap: int | None = None) -> ThreadPolicy:
    """Start the policy for this process (the commands do; library calls keep torch's count)."""
    global _active
    _active = ThreadPolicy(cap)
    _active.start()
    return _active


def tick() -> None:
    """Re-check the idle cores if the policy is active and its interval has passed (cheap)."""
    if _active is not None:
        _active.tick()
