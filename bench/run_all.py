"""Run every benchmark script under bench/ in turn and print their figures.

Each script prints its own figures (see docs/benchmarks.md for what each measures
and the targets). Usage: ``make bench`` or ``python bench/run_all.py [name ...]``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["bench_store", "bench_broker", "bench_produce", "bench_consume", "bench_delayed", "bench_spark"]


def main(argv: list[str]) -> int:
    names = argv or [n for n in ORDER if (HERE / f"{n}.py").exists()]
    failed = []
    for name in names:
        script = HERE / f"{name}.py"
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)], cwd=HERE.parent)
        print(f"--- {name}: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
