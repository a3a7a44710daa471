"""A real run dies cleanly on every signal: SIGTERM and SIGHUP end it like Ctrl-C (ranks stopped,
exit 128 + signal, one line saying so), and SIGKILL to simpar takes its ranks with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from rank_processes import left_after, ranks_of, started_by

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


RUN = ["run", "--compare-real", "--gpus", "4", "--model", "tiny", "--steps", "100000", "--timeout", "300"]
# validate runs its cases through the same launcher (calibrating first where it has no profile)
VALIDATE = ["validate", "--gpus", "4", "--strategies", "ddp", "--steps", "100000", "--timeout", "300"]


@pytest.mark.parametrize("sig,command", [(signal.SIGTERM, RUN), (signal.SIGHUP, RUN), (signal.SIGKILL, RUN),
                                         (signal.SIGTERM, VALIDATE)],
                         ids=["SIGTERM-run", "SIGHUP-run", "SIGKILL-run", "SIGTERM-validate"])
def test_a_signal_to_a_real_run_leaves_no_rank_behind(tmp_path, sig, command):
    proc = subprocess.Popen([sys.executable, "-m", "simpar", *command], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        ranks = []
        while len(ranks) < 4:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.5)
            ranks = ranks_of(proc.pid)
        time.sleep(3)  # the ranks are past start-up, inside the run
        ranks = started_by(proc.pid)  # the fork server they came from too
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=30)
        assert not left_after(ranks), f"rank processes left after {sig.name}"
        err = proc.stderr.read().decode().strip().splitlines()
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:
            assert code == 128 + sig
            assert err[-1] == f"simpar: terminated by {sig.name} (rank processes, if any, stopped)"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
