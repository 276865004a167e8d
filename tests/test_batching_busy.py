"""A rank's compute time at the CPU share it gets (no MPI): a CPU quota's stalls counted
wherever they fall (also under a real quota, as root), the emulation's stretch kept, an idle
core unchanged."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from hethpc.batching.busy import CpuShare
from hethpc.testbed import Testbed
from hethpc.testbed.kernel import missing


def test_a_dedicated_core_keeps_the_compute_time() -> None:
    s = CpuShare()
    for w in (0.010, 0.012, 0.009, 0.011):
        s.add(w, w)
    assert s.share == pytest.approx(1.0)
    assert s.at_share(0.008, 0.008) == pytest.approx(0.008)


def test_quota_stalls_outside_the_compute_still_count() -> None:
    # 10 ms of CPU per step; under half a core every 5th step stalls 40 ms (anywhere)
    s = CpuShare(span_s=0.5)
    for k in range(100):
        s.add(0.010 + (0.040 if k % 5 == 4 else 0.0), 0.010)
    assert s.share == pytest.approx(50 / 90, rel=0.12)
    # an unstalled 6 ms forward/backward is charged its share of the stalls
    assert s.at_share(0.006, 0.006) == pytest.approx(0.006 * 90 / 50, rel=0.12)


def test_several_busy_threads_keep_the_wall_time() -> None:
    s = CpuShare()
    for _ in range(5):
        s.add(0.010, 0.035)
    assert s.at_share(0.035, 0.010) == pytest.approx(0.010)


def test_the_window_forgets_an_old_speed() -> None:
    s = CpuShare(span_s=0.2)
    for _ in range(50):
        s.add(0.030, 0.010)  # throttled to a third
    for _ in range(50):
        s.add(0.010, 0.010)  # then a free core
    assert s.share == pytest.approx(1.0)


@pytest.mark.parametrize(
    "wall, cpu", [(math.nan, 0.01), (0.0, 0.01), (0.01, math.inf)], ids=["nan", "zero", "inf"]
)
def test_unusable_readings_are_left_out(wall: float, cpu: float) -> None:
    s = CpuShare()
    s.add(wall, cpu)
    assert math.isnan(s.share) and s.at_share(0.005, 0.007) == 0.007


def test_a_step_without_marks_keeps_the_timed_compute() -> None:
    assert CpuShare().end_step(0.123) == 0.123


def _work(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_emulated_stretch_is_added_and_kept_out_of_the_share() -> None:
    s = CpuShare()
    for _ in range(5):
        s.begin_step()
        s.begin_compute()
        t0 = time.perf_counter()
        _work(0.01)
        s.end_compute()
        real = time.perf_counter() - t0
        time.sleep(real)  # --slowdown 2, sleeping: the timed compute is twice the real one
        got = s.end_step(2 * real)
        assert got == pytest.approx(2 * real, rel=0.5)
    assert s.share == pytest.approx(1.0, rel=0.3)  # the sleep did not lower the share


_QUOTA_STEPS = """
import json, sys, time
from hethpc.batching.busy import CpuShare

def work(s):
    end = time.thread_time() + s
    while time.thread_time() < end:
        pass

share = CpuShare(schedstat=sys.argv[1] == "1")
owns, cpus = [], []
t_end = time.perf_counter() + 4.0
while time.perf_counter() < t_end:
    share.begin_step()
    share.begin_compute()
    c0 = time.thread_time()
    work(0.004)  # the forward and backward
    share.end_compute()
    cpus.append(time.thread_time() - c0)
    time.sleep(0.003)  # a wait for the other rank that sleeps
    work(0.004)  # the optimizer step and the next batch
    owns.append(share.end_step(0.004))
half = len(owns) // 2
print(json.dumps({"share": share.share, "stretch": sum(owns[half:]) / sum(cpus[half:])}))
"""


@pytest.mark.skipif(bool(missing()), reason="a CPU quota needs " + "; ".join(missing()))
@pytest.mark.skipif(not CpuShare().schedstat, reason="no /proc/thread-self/schedstat here")
@pytest.mark.timeout(90)
def test_a_real_quota_stretches_the_compute_by_its_share() -> None:
    """Under a third of a core, stalls that land anywhere in the step (in the work after the
    forward and backward, in the wait) make the compute time about 3x its CPU time."""
    with Testbed([{"cpu": 0.33}], name="tbusy") as bed:
        proc = subprocess.run(
            bed.node_argv(0, [sys.executable, "-c", _QUOTA_STEPS, "1"]), capture_output=True,
            text=True, timeout=60, env=bed.env(),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["share"] == pytest.approx(0.33, rel=0.15), got
    assert got["stretch"] == pytest.approx(1 / 0.33, rel=0.15), got
