"""One process per run dir (posbench.runs.lock): real locks held by real processes."""

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from posbench.runs.lock import LOCK_NAME, RunDirBusy, boot_id, hold, is_alive, process_start

# Holds the run dir's lock as `posbench train` does, says so, and waits to be killed.
HOLDER = r'''
import sys, time
from pathlib import Path
from posbench.runs.lock import hold
with hold(sys.argv[1], "train"):
    Path(sys.argv[2]).touch()
    time.sleep(600)
'''


def start_holder(run, tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), str(ready)], stdin=subprocess.DEVNULL)
    while not ready.exists():
        assert proc.poll() is None, "the holder died"
        time.sleep(0.02)
    return proc


def test_a_live_holder_refuses_others_and_a_killed_one_blocks_nobody(tmp_path):
    run = tmp_path / "run"
    proc = start_holder(run, tmp_path)
    try:
        for command, shared in (("train", False), ("eval", True)):
            with pytest.raises(RunDirBusy) as refused:
                with hold(run, command, shared=shared):
                    pass
            assert f"is in use by posbench train (pid {proc.pid} on host {socket.gethostname()}, started " \
                   in str(refused.value)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == proc.pid  # left behind by the kill
    messages = []
    with hold(run, "train", log=messages.append):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] != proc.pid
    assert messages == [f"posbench: {run / LOCK_NAME} was left by posbench train (pid {proc.pid} on host "
                        f"{socket.gethostname()}, started {messages[0].split('started ')[1]}"]
    assert not (run / LOCK_NAME).exists()  # released and removed


def test_evaluations_share_a_run_dir_but_not_with_training(tmp_path):
    with hold(tmp_path, "eval", shared=True), hold(tmp_path, "eval", shared=True):
        with pytest.raises(RunDirBusy, match="is in use by posbench eval"):
            with hold(tmp_path, "train"):
                pass
    with hold(tmp_path, "train"):
        pass
    assert not (tmp_path / LOCK_NAME).exists()


def test_recorded_holders_where_the_file_system_has_no_locks():
    """Without flock, the lock file's record decides: this process, on this host and boot, is alive;
    the same pid after a reboot, a pid that is not running, are stale; another host cannot be checked."""
    import os

    me = {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id(),
          "process_start": process_start(os.getpid())}
    assert is_alive(me)
    assert not is_alive({**me, "boot_id": "another boot"})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not is_alive({**me, "pid": int(dead.stdout), "process_start": ""})
    if me["process_start"]:
        assert not is_alive({**me, "process_start": str(int(me["process_start"]) + 1)})  # pid reused
    assert is_alive({**me, "host": "another-host"})
    assert not is_alive({})
