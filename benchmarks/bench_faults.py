"""Fault to exit: how long a 2-rank job takes to end after one rank fails, default settings.

    .venv/bin/python benchmarks/bench_faults.py            # kill, raise, sigstop, stall
    .venv/bin/python benchmarks/bench_faults.py --quick    # kill and raise only

Each case launches ``jobs/train.py`` on 2 ranks (MNIST-1D, an MLP, enough epochs to outlast the
fault) with the default watchdog, waits until rank 1's heartbeat shows it training past step
``--at``, and then makes rank 1 fail: ``kill`` (SIGKILL from outside), ``sigstop`` (SIGSTOP from
outside: the process exists but never runs again), ``raise`` (``--fault 1:S:raise``) and
``stall`` (``--fault 1:S:stall``: the rank sleeps forever in its step). The time is measured from
the fault (the signal, or the time the injected fault prints as it acts) to the exit of
mpirun. The last stdout line is one JSON object: seconds per case and the exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _beat(run_dir: Path, rank: int) -> dict | None:
    try:
        return json.loads((run_dir / "heartbeat" / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def measure(kind: str, *, at: int, cache: Path) -> tuple[float, int]:
    """Seconds from rank 1's fault of ``kind`` to the job's end, and mpirun's exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        argv = [
            "--samples", "20000", "--batch-size", "64", "--epochs", "100", "--model", "mlp",
            "--cache-dir", str(cache), "--run-dir", str(run_dir), "--progress", "false",
        ]  # fmt: skip
        if kind in ("raise", "stall"):
            argv += ["--fault", f"1:{at}:{kind}"]
        cmd = [str(ROOT / "scripts" / "mpirun.sh"), "-np", "2", sys.executable,
               str(ROOT / "jobs" / "train.py"), *argv]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "600"}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            t0 = None
            if kind in ("kill", "sigstop"):
                while True:
                    beat = _beat(run_dir, 1)
                    if beat is not None and beat["step"] >= at:
                        break
                    if proc.poll() is not None:
                        raise RuntimeError(f"{kind}: the job ended early: {proc.stderr.read()}")  # type: ignore[union-attr]
                    time.sleep(0.05)
                t0 = time.time()
                os.kill(beat["pid"], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            _, err = proc.communicate(timeout=600)
            t_end = time.time()
        finally:
            proc.kill()
        if t0 is None:
            m = re.search(r"hethpc fault: rank 1 \w+ at step \d+ \(time ([0-9.]+)\)", err)
            if m is None:
                raise RuntimeError(f"{kind}: the fault never acted: {err[-2000:]}")
            t0 = float(m.group(1))
        took = t_end - t0
        last = [line for line in err.splitlines() if "hethpc watchdog" in line or "rank 1" in line]
        print(f"{kind:8s} {took:6.1f} s  exit {proc.returncode}  {last[:1]}", flush=True)
        return took, proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the kill and raise cases")
    ap.add_argument("--at", type=int, default=30, help="the step at which rank 1 fails")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/hethpc"))
    args = ap.parse_args(argv)
    kinds = ("kill", "raise") if args.quick else ("kill", "raise", "sigstop", "stall")
    result: dict[str, object] = {}
    for kind in kinds:
        took, code = measure(kind, at=args.at, cache=Path(args.cache))
        result[f"{kind}_to_exit_s"] = round(took, 1)
        result[f"{kind}_exit_code"] = code
    result["worst_to_exit_s"] = max(v for k, v in result.items() if k.endswith("_s"))  # type: ignore[type-var]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
