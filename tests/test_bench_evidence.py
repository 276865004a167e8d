"""bench_evidence, the evidence protocol: its arithmetic, its workload file, every scenario's
settings valid, a peer's settings, the testbed's command, and --quick runs end to end (tuning,
target, choice, seeds), one with the peers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _peer_runs  # noqa: E402
import _protocol  # noqa: E402
import bench_evidence  # noqa: E402
import peer_ddp  # noqa: E402

from hethpc.train import TrainConfig  # noqa: E402

WORKLOAD_TEXT = bench_evidence.WORKLOAD.read_text()


@pytest.mark.parametrize(
    ("curve", "target", "want"),
    [
        ([(1.0, 0.5), (2.0, 0.9)], 0.7, 2.0),
        ([(1.0, 0.8)], 0.4, 1.0),
        ([(1.0, 0.5), (2.0, 0.6)], 0.9, None),
        ([(1.0, 0.9), (2.0, 0.95)], 0.9, 1.0),
    ],
    ids=["no-interpolation", "first-point", "never", "at-a-point"],
)
def test_time_to_target_is_the_first_evaluation_at_or_above(
    curve: list, target: float, want: float | None
) -> None:
    assert _protocol.first_reaching(curve, target) == want


def test_bits_per_byte_reach_their_target_from_above() -> None:
    bpb = _protocol.METRICS["bpb"]
    curve = [(1.0, 4.0), (2.0, 3.2), (3.0, 3.0)]
    assert _protocol.first_reaching(curve, 3.2, bpb) == 2.0
    assert _protocol.first_reaching(curve, 2.9, bpb) is None
    assert bpb.target(3.1, 0.05) == pytest.approx(3.15)  # the margin is worse: higher
    assert _protocol.METRICS["acc"].target(0.98, 0.005) == pytest.approx(0.975)
    # the choice prefers the lower final bits per byte, and a diverged run (None) least
    a, b, c = ({"tta": None, "final": bpb.rank(v)} for v in (3.4, 3.1, None))
    assert _protocol.pick([a, b, c]) is b
    assert bpb.show(3.14159) == "3.142 bpb" and _protocol.METRICS["acc"].show(0.9712) == "97.12 %"


def test_the_text_workload_converts_its_data_first(tmp_path: Path) -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD.parent / "text.toml")
    assert _protocol.metric_of(work["protocol"]).key == "bpb"
    assert _protocol.converted_out(work) == work["base"]["data"]
    assert _protocol.converted_out(_protocol.load_workload(bench_evidence.WORKLOAD)) is None
    bad = tmp_path / "bad.toml"
    bad.write_text(WORKLOAD_TEXT + '\n[prepare]\nconvert = ["text", "--context", "64"]\n')
    with pytest.raises(SystemExit, match=r"\[prepare\] convert must be .* --out OUT"):
        _protocol.load_workload(bad)


def test_a_workload_names_a_known_metric(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(WORKLOAD_TEXT.replace("[protocol]\n", '[protocol]\nmetric = "loss"\n', 1))
    with pytest.raises(SystemExit, match="metric = 'loss'.*'acc', 'bpb'"):
        _protocol.load_workload(bad)


def test_the_host_probe_names_the_drift_between_runs() -> None:
    runs = {"bsp": [{"probe_ms": [50.0, 52.0]}, {"probe_ms": [51.0, 104.0]}],
            "fedavg": [{"probe_ms": [50.0, 52.0]}, {"val": []}]}  # fmt: skip
    said = _protocol.probe_drift(runs)
    assert "52.0 ms [52.0..104.0] on the slower rank" in said and "2.00x" in said
    assert _protocol.probe_drift({"bsp": [{"val": []}]}) == ""  # runs from before the probe
    assert 0 < _protocol.compute_probe_ms(repeats=5) < 1000


def test_pick_prefers_the_earliest_then_the_better_final() -> None:
    a = {"tta": 5.0, "final": 0.90}
    b = {"tta": 4.0, "final": 0.80}
    c = {"tta": None, "final": 0.99}
    d = {"tta": 4.0, "final": 0.85}
    assert _protocol.pick([a, b, c, d]) is d
    assert _protocol.pick([c, {"tta": None, "final": 0.5}]) is c
    with pytest.raises(ValueError):
        _protocol.pick([])


def test_spread_counts_the_runs_that_got_there() -> None:
    s = _protocol.spread([3.0, None, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "of": 4}
    assert _protocol.spread([None])["median"] is None


def test_evaluations_every_so_many_samples() -> None:
    assert [_protocol.eval_every_steps(3200, b) for b in (128, 256, 512)] == [25, 12, 6]


@pytest.mark.parametrize("name", ["mnist1d", "text"])
def test_every_scenario_and_method_of_the_workload_is_a_valid_run(name: str) -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD.parent / f"{name}.toml")
    for scen in work["scenarios"].values():
        for m in scen["methods"]:
            method = work["methods"][m]
            for value in method.get("values", [None]):
                kw = {**work["base"], **_protocol.scenario_settings(scen),
                      **_protocol.method_settings(method, value)}  # fmt: skip
                TrainConfig(**kw)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[base]\nmodel='mlp'\n", r"needs a \[protocol\] table"),
        ("[base]\na=1\n[protocol]\nmargin=0.1\n[methods.bsp]\nsync='bsp'\n[scenarios.x]\n"
         "ranks=2\n", r"\[protocol\] needs eval_every_samples"),
        (bench_evidence.WORKLOAD.read_text().replace('"selsync_dynamic",', '"selsync_dynamc",'),
         r"unknown methods \['selsync_dynamc'\]"),
        ("[base", r"cannot read the workload"),
        (WORKLOAD_TEXT.replace('"ssp"]', '"ssp", "horovod"]', 1),
         r"\[scenarios.demo\] lists the peers \['horovod'\] but emulates"),
        (WORKLOAD_TEXT.replace('[methods.ddp]\npeer = "ddp"', '[methods.ddp]\npeer = "mpi"'),
         r"\[methods.ddp\] peer = 'mpi' is not a peer"),
        (WORKLOAD_TEXT.replace('[methods.ddp]\n', '[methods.ddp]\nbatching = "dynamic"\n'),
         r"\[methods.ddp\] is the peer 'ddp': it takes no hethpc settings but compression"),
        (WORKLOAD_TEXT.replace('[methods.ddp_powersgd]', '[methods.torch_powersgd]'),
         r"\[methods.torch_powersgd\] is the peer 'ddp': name it ddp or ddp_SOMETHING"),
        (WORKLOAD_TEXT.replace('"cpu=0.33,link=200mbit"]', '"cpu=0.33,link=200mbit", "cpu=1"]'),
         r"\[scenarios.testbed_iid_3x\] testbed has 3 slots for ranks = 2"),
        (WORKLOAD_TEXT.replace('"cpu=0.33,link=200mbit"]', '"cpu=0.33,link=200mbps"]'),
         r"\[scenarios.testbed_iid_3x\] testbed"),
        (WORKLOAD_TEXT.replace("\ndemo = [", "\ndemoo = [", 1),
         r"\[profiles.goals\] names the scenario 'demoo', which the workload lacks"),
        (WORKLOAD_TEXT.replace('testbed_iid_3x = ["bsp", ', 'testbed_iid_3x = [', 1),
         r"\[profiles.goals\] testbed_iid_3x = .*bsp among them"),
        (WORKLOAD_TEXT.replace('testbed_iid_3x = ["bsp", ', 'testbed_iid_3x = ["bsp", "ssp", ', 1),
         r"\[profiles.goals\] testbed_iid_3x = .*take methods the scenario runs"),
    ],
    ids=["no-protocol", "missing-key", "typo-in-a-method", "not-toml", "peer-emulated",
         "unknown-peer", "peer-with-settings", "peer-misnamed", "testbed-ranks", "testbed-spec",
         "profile-scenario", "profile-without-bsp", "profile-method"],
)
def test_a_bad_workload_is_one_line_naming_the_file(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "w.toml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=match) as e:
        _protocol.load_workload(path)
    assert str(path) in str(e.value)


def test_a_peer_gets_the_runs_settings() -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD)
    scen = work["scenarios"]["testbed_demo"]
    settings = {**work["base"], **_protocol.scenario_settings(scen),
                **_protocol.method_settings(work["methods"]["ddp"]), "lr": 0.2,
                "batch_size": 256, "seed": 3, "eval_every_steps": 12}  # fmt: skip
    args = peer_ddp.parse_args(_peer_runs.peer_argv(settings, "ddp"))
    want = {"lr": 0.2, "batch_size": 256, "seed": 3, "epochs": 6, "partition": "labels",
            "labels_per_rank": 6, "samples": 20000, "data_seed": 42, "val_fraction": 0.1,
            "eval_every_steps": 12, "momentum": 0.9, "lr_schedule": "wsd",
            "powersgd": 0}  # fmt: skip
    assert {k: getattr(args, k) for k in want} == want
    # the compressed peers: the workload's settings become each peer's own flag
    ddp_psgd = {**settings, **_protocol.method_settings(work["methods"]["ddp_powersgd"])}
    assert peer_ddp.parse_args(_peer_runs.peer_argv(ddp_psgd, "ddp")).powersgd == 4
    ddp_fp16 = {**settings, **_protocol.method_settings(work["methods"]["ddp_fp16"])}
    assert peer_ddp.parse_args(_peer_runs.peer_argv(ddp_fp16, "ddp")).fp16_compress
    hvd_fp16 = {**settings, **_protocol.method_settings(work["methods"]["horovod_fp16"])}
    assert "--fp16-allreduce" in _peer_runs.peer_argv(hvd_fp16, "horovod")
    with pytest.raises(SystemExit, match="peer horovod has no counterpart of compression 'int8'"):
        _peer_runs.peer_argv({**settings, "compression": "int8", "sync": "fedavg"}, "horovod")


def test_a_testbed_scenario_launches_through_the_testbed() -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD)
    scen = work["scenarios"]["testbed_iid_3x"]
    assert "testbed" not in _protocol.scenario_settings(scen)
    cmd = bench_evidence.on_testbed(scen, ["scripts/mpirun.sh", "-np", "2"])
    assert cmd[1:] == [str(ROOT / "jobs" / "testbed.py"), "--name", "evidence", "run",
                       "--node", "cpu=1,link=200mbit", "--node", "cpu=0.33,link=200mbit", "--",
                       "scripts/mpirun.sh", "-np", "2"]  # fmt: skip
    assert bench_evidence.on_testbed(work["scenarios"]["demo"], ["x"]) == ["x"]


def test_a_testbed_scenario_on_a_host_without_one_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hethpc.testbed.kernel

    monkeypatch.setattr(hethpc.testbed.kernel, "missing", lambda: ["root"])
    monkeypatch.setattr(bench_evidence, "under_mpi", lambda: False)
    with pytest.raises(SystemExit, match=r"scenario testbed_demo runs on a testbed .* lacks root"):
        bench_evidence.main(["--only", "testbed_demo"])
    launched: list[list[str]] = []

    def launch(cmd: list[str], _env: object) -> None:
        launched.append(cmd)
        raise KeyboardInterrupt  # stop at the first scenario's launch

    monkeypatch.setattr(bench_evidence, "run_ranks", launch)
    monkeypatch.setattr(bench_evidence, "_commit", lambda: "unknown")
    with pytest.raises(KeyboardInterrupt):  # all scenarios: the testbed's are left out
        bench_evidence.main([])
    out = capsys.readouterr().out
    assert "testbed_iid_3x: left out" in out and "testbed_demo: left out" in out
    assert launched[0][0].endswith("mpirun.sh") and "demo" in launched[0]


def _in_session(sid: int) -> list[str]:
    """The live processes of session ``sid`` (/proc), as "pid command"."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{stat.parent.name} {text.split('(', 1)[1].rsplit(')', 1)[0]}")
    return found


def _as_at_a_terminal() -> None:
    """Ctrl-C's default action, which a command started in the background (``make test &``, a CI
    runner) inherits as ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_an_interrupted_protocol_leaves_no_runs_behind(how: str) -> None:
    # a scheduler's cancel (SIGTERM to the benchmark) or Ctrl-C at a terminal (SIGINT to the
    # whole process group) during the first runs: the ranks end and their run directories go
    # (a temporary folder of its own, short: Open MPI's sockets live there too)
    tmp = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))
    try:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "bench_evidence.py"), "--quick"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            start_new_session=True, preexec_fn=_as_at_a_terminal,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "170",
                 "TMPDIR": str(tmp)},
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not list(tmp.glob("hethpc-scratch-*/hethpc-evidence-*/*")):  # a run started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
        time.sleep(1.0)
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=90)[0]
        assert proc.returncode == (143 if how == "SIGTERM" else 130), out
        assert f"stopped by {how}; its ranks have ended" in out and "Traceback" not in out, out
        alive = _in_session(proc.pid)  # the ranks too (mpirun gives them groups of their own)
        assert alive == [], f"still running: {alive}\n{out[-2000:]}"
        left = [p.name for p in tmp.iterdir() if p.name.startswith(("hethpc-", "bench-"))]
        assert left == [], f"{sorted(str(p) for p in tmp.rglob('*'))[:20]}\n{out[-2000:]}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself")
@pytest.mark.timeout(600)
def test_quick_protocol_tunes_fixes_a_target_and_measures_every_seed(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_evidence.py"), "--quick",
         "--tables", str(tmp_path / "t.md")],
        capture_output=True, text=True, timeout=560, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "540"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    (name, res), = result["detail"].items()
    assert set(res["medians"]) == {"bsp", "selsync_dynamic"}
    finals = res["target_finals"]  # BSP's one grid point on the target seeds 100 and 101
    assert len(finals) == 2 and finals[0] == res["tuning"]["bsp"][0]["final_val"]
    assert res["target"] == pytest.approx(sum(finals) / 2 - 0.005)
    # the grid (two points in --quick, lr 50 diverging), then the knob's other value at the
    # best point
    assert len(res["tuning"]["selsync_dynamic"]) == 3 and len(res["tuning"]["bsp"]) == 2
    wild = [t for ts in res["tuning"].values() for t in ts if t["lr"] == 50.0]
    assert all(t.get("diverged") or t["final_val"] < 0.3 for t in wild), wild
    assert {c["lr"] for c in res["chosen"].values()} == {0.1}
    for m, runs in res["runs"].items():
        assert [r["seed"] for r in runs] == [0, 1], m
        for r in runs:
            assert r["val"] and r["tta_val"] in (None, *(t for t, _ in r["val"]))
            assert len(r["probe_ms"]) == 2 and min(r["probe_ms"]) > 0  # each rank's probe
    tables = (tmp_path / "t.md").read_text()
    assert f"### {name}" in tables and "Host speed: the same compute before each" in tables
    assert result["commit"]

    # the same run's last line, frozen: one more seed measured at its target and choices
    # (under a profile whose first scenario is the same, passed on to the launched ranks)
    frozen = tmp_path / "frozen.json"
    frozen.write_text(proc.stdout.strip().splitlines()[-1])
    again = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_evidence.py"), "--quick",
         "--frozen", str(frozen), "--seeds", "2", "--profile", "goals"],
        capture_output=True, text=True, timeout=200, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "190"},
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    last = json.loads(again.stdout.strip().splitlines()[-1])
    more = last["detail"][name]
    assert last["profile"] == "goals" and result["profile"] is None
    assert "profile goals: what the goals are judged on" in again.stdout
    assert "tune " not in again.stdout and "measuring only" in again.stdout
    assert more["target"] == res["target"] and more["chosen"] == res["chosen"]
    assert more["tuning"] == {} and "frozen_from" in more
    assert {m: [r["seed"] for r in rs] for m, rs in more["runs"].items()} == {
        m: [2] for m in res["runs"]}


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself")
@pytest.mark.timeout(300)
def test_quick_protocol_runs_the_peers_as_methods(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_evidence.py"), "--quick-peers"],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "270"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])["detail"]["peers_shm"]
    assert set(res["medians"]) == {"bsp", "horovod", "ddp"}
    for peer in ("horovod", "ddp"):
        tuned = {t["lr"]: t for t in res["tuning"][peer]}
        assert tuned[50.0]["diverged"].startswith("non-finite training loss"), tuned[50.0]
        assert tuned[0.1]["val"] and 0.1 < tuned[0.1]["final_val"] <= 1.0
        assert res["chosen"][peer]["lr"] == 0.1
        (run,) = res["runs"][peer]
        # every 5 steps (320 samples at batch 64) of 20, the clock stopped while scoring
        assert len(run["val"]) == 4 and run["val"] == sorted(run["val"])
        assert run["val"][-1][0] <= run["train_time_s"] < run["time_s"]
        assert run["final_val"] == run["val"][-1][1] and run["peer"] == peer


def test_goals_are_ratios_to_the_tuned_bsp_and_to_each_peer_on_the_same_nodes() -> None:
    def med(times: list[float | None]) -> dict[str, dict[str, object]]:
        return {"tta_val": _protocol.spread(times)}

    res = {"medians": {"bsp": med([20.0, 22.0, None]), "fedavg_dynamic": med([10.0, 11.0, 12.0]),
                       "horovod": med([40.0, None, None])}}  # fmt: skip
    g = bench_evidence.goals({"tb": res})
    assert g["tb_fedavg_dynamic_over_bsp"] == pytest.approx(11.0 / 21.0, abs=1e-3)
    assert g["tb_fedavg_dynamic_over_bsp_every_seed"] == g["tb_fedavg_dynamic_over_bsp"]
    assert g["tb_bsp_over_bsp_every_seed"] is None  # one seed never reached it
    assert g["tb_fedavg_dynamic_over_horovod"] == pytest.approx(11.0 / 40.0, abs=1e-3)
    assert g["tb_bsp_over_horovod"] == pytest.approx(21.0 / 40.0, abs=1e-3)
    assert "tb_horovod_over_horovod" not in g and "tb_fedavg_dynamic_over_ddp" not in g


def test_methods_cut_every_scenario_and_keep_bsp() -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD)
    cut = bench_evidence.only_methods(work, ["diloco", "ssp"])
    assert cut["scenarios"]["demo"]["methods"] == ["bsp", "diloco", "ssp"]
    assert cut["scenarios"]["testbed_demo"]["methods"] == ["bsp"]
    assert work["scenarios"]["demo"]["methods"][-2:] == ["diloco", "ssp"]  # not changed
    with pytest.raises(SystemExit, match="unknown method.*dilco"):
        bench_evidence.only_methods(work, ["dilco"])


def test_a_profile_cuts_the_scenarios_and_their_methods() -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD)
    goals = bench_evidence.with_profile(work, "goals")
    assert list(goals["scenarios"]) == ["demo", "iid_3x_slowlink", "testbed_iid_3x"]
    assert goals["scenarios"]["testbed_iid_3x"]["methods"] == [
        "bsp", "bsp_dynamic", "fedavg_dynamic", "horovod"]  # fmt: skip
    assert goals["scenarios"]["demo"]["link"] == work["scenarios"]["demo"]["link"]
    assert len(work["scenarios"]["demo"]["methods"]) == 6  # not changed
    with pytest.raises(SystemExit, match="'goal': no such profile; the workload's profiles: goals"):
        bench_evidence.with_profile(work, "goal")


def test_frozen_choices_name_what_is_missing(tmp_path: Path) -> None:
    work = _protocol.load_workload(bench_evidence.WORKLOAD)
    name = next(iter(work["scenarios"]))
    methods = work["scenarios"][name]["methods"]
    chosen = {m: {"lr": 0.1, "batch": 128, "knob": None} for m in methods}
    whole = {"target": 0.97, "chosen": chosen, "target_finals": [0.975], "target_setting": {}}
    f = tmp_path / "frozen.json"
    f.write_text(json.dumps({"detail": {name: whole}}))  # an earlier run's last line
    assert _protocol.load_frozen(f, [name], work)[name]["target"] == 0.97
    f.write_text(json.dumps({name: whole}))
    with pytest.raises(SystemExit, match=r"frozen.json: no frozen choices for the scenario x; "):
        _protocol.load_frozen(f, ["x"], work)
    f.write_text(json.dumps({name: {**whole, "chosen": {}}}))
    with pytest.raises(SystemExit, match=rf"\[{name}\] chose nothing for the method bsp"):
        _protocol.load_frozen(f, [name], work)
    f.write_text(json.dumps({name: {k: v for k, v in whole.items() if k != "target"}}))
    with pytest.raises(SystemExit, match=rf"\[{name}\] needs 'target'"):
        _protocol.load_frozen(f, [name], work)
    f.write_text("{not json")
    with pytest.raises(SystemExit, match="frozen.json: cannot read the frozen choices"):
        _protocol.load_frozen(f, [name], work)
    assert bench_evidence.parse_seeds("3, 4") == [3, 4]
    with pytest.raises(SystemExit, match="--seeds 'three'"):
        bench_evidence.parse_seeds("three")
