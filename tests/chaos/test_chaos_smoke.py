"""The fault campaign's smoke run (docs/chaos.md): seed 4721 for 54 s of workload
and faults (where namespaces, tmpfs and etcdctl exist, that seed's schedule draws 11
faults of 11 kinds, among them an etcd restored from a backup, a full disk, a replica
added and removed, a hand-over and an answer-dropping etcd proxy), then the heal, the final reads,
``equeue cluster verify`` and the checker. About 75 s of wall time on 2 cores; fails
on any violation, quoting the run's report and its first violation.

It runs ``python -m tests.chaos`` as a child process: the run cleans up its
processes and namespaces itself (SIGTERM on a timeout lets it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.cluster import ETCD_BINARY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SEED, MINUTES = 4721, 0.9


def test_chaos_smoke(tmp_path: Path) -> None:
    if not os.access(ETCD_BINARY, os.X_OK):
        pytest.skip(f"{ETCD_BINARY} missing (make test installs etcd-server)")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tests.chaos", "--seed", str(SEED), "--minutes", str(MINUTES), "--dir", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the run stops its cluster and removes its namespaces
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"the chaos run did not finish within 240 s:\n{out[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    print(out[-4000:])
    assert proc.returncode == 0, f"chaos run seed {SEED} failed (exit {proc.returncode}):\n{out[-8000:]}"
    assert "VERDICT: VALID" in out, out[-4000:]
