"""The testbed: node descriptions (anywhere), and as root its enforced CPU quotas, shaped links,
launching across nodes and complete removal (also after Ctrl-C, SIGTERM and SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hethpc.testbed import NodeSpec, SpecError, Testbed, TestbedError, kernel, load_nodes
from hethpc.testbed.bed import CGROUP_ROOT, PREFIX, STATE_ROOT
from hethpc.testbed.checks import measure_cpu, measure_link
from hethpc.testbed.kernel import missing
from hethpc.testbed.spec import format_cores, parse_cores, parse_flag, parse_rate

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = (str(ROOT / "scripts" / "mpirun.sh"),)
LACKS = missing()
needs_root = pytest.mark.skipif(bool(LACKS), reason="testbed needs " + "; ".join(LACKS))


# --- node descriptions -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, bits",
    [("200mbit", 200_000_000), ("1gbit", 10**9), ("1.5Gbit/s", 1_500_000_000), (8000, 8000)],
    ids=["mbit", "gbit", "decimal-with-per-second", "number"],
)
def test_parse_rate(text: str | int, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize(
    "text, match",
    [("200mbps", "bits per second"), ("fast", "not a rate"), ("10bit", "at least 8kbit")],
    ids=["bytes-unit-refused", "words", "too-slow"],
)
def test_parse_rate_refuses(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_rate(text)


def test_nodes_from_toml_json_and_mappings(tmp_path: Path) -> None:
    f = tmp_path / "nodes.toml"
    f.write_text(
        '[[node]]\ncpu = 1.0\nlink = "1gbit"\n[[node]]\ncpu = 0.5\nlink = "200mbit"\nslots = 2\n'
    )
    want = [NodeSpec(1.0, 10**9, 1), NodeSpec(0.5, 200_000_000, 2)]
    assert load_nodes(f) == want
    assert (
        load_nodes('[{"cpu": 1.0, "link": "1gbit"}, {"cpu": 0.5, "link": "200mbit", "slots": 2}]')
        == want
    )
    assert load_nodes([{"cpu": "none"}]) == [NodeSpec(None, None, 1)]
    assert load_nodes([{"cpu": 0.5, "cores": "0"}, {"cores": [0]}, {"cores": "none"}]) == [
        NodeSpec(0.5, None, 1, (0,)), NodeSpec(None, None, 1, (0,)), NodeSpec(None, None, 1),
    ]  # fmt: skip


def test_cores_lists_and_their_description() -> None:
    with pytest.raises(SpecError, match="cores takes a range or a list with spaces in a flag"):
        parse_flag("cpu=1,cores=0,1,link=200mbit", where="--node")
    assert parse_cores("0-2 5", where="n", host=8) == (0, 1, 2, 5)
    assert parse_cores([3, 1], where="n", host=8) == (1, 3)
    assert format_cores((0, 1, 2, 5)) == "0-2 5"
    pinned = NodeSpec(1.0, 200_000_000, 1, (0, 1))
    assert pinned.describe() == "cpu=1 cores=0-1 link=200mbit slots=1"


@pytest.mark.parametrize(
    "nodes, match",
    [
        ([{"cpu": 0.5, "speed": 2}], r"node 0 of nodes: unknown key\(s\) \['speed'\]"),
        ([{"cpu": 0}], "node 0 of nodes: cpu 0 is out of range"),
        ([{"cpu": "half"}], "not a number of cores"),
        ([{}, {"slots": 0}], "node 1 of nodes: slots must be a whole number >= 1"),
        ([{"cores": "0,1"}], "is not a list of host CPUs"),
        ([{"cores": str(os.cpu_count())}], "this host has CPUs 0-"),
        ([{"cores": "0 0"}], "must name each host CPU once"),
        ([{"cpu": 1.5, "cores": "0"}], r"cpu 1.5 is more than its 1 core\(s\) '0' can give"),
        ([], "non-empty list of nodes"),
        ("/nonexistent/nodes.toml", "does not exist"),
    ],
    ids=["unknown-key", "zero-cpu", "cpu-word", "zero-slots", "cores-commas", "cores-beyond",
         "cores-twice", "cpu-over-cores", "empty", "missing-file"],
)
def test_bad_nodes_are_named(nodes: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        load_nodes(nodes)  # type: ignore[arg-type]


def test_bad_name_refused() -> None:
    with pytest.raises(TestbedError, match="1-12 lowercase letters"):
        Testbed([{}], name="My-Bed")


def test_name_is_taken_before_or_after_the_sub_command(capsys: pytest.CaptureFixture[str]) -> None:
    from hethpc.cli.testbed import main

    for argv in (["--name", "nope", "down"], ["down", "--name", "nope"]):
        assert main(argv) == 0
        assert "no testbed named 'nope' is up" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["down", "--nodes", "x.toml"])
    err = capsys.readouterr().err
    assert "--nodes is not taken there: see hethpc-testbed --help" in err
    assert "did you mean" not in err


# --- on the kernel (root) ------------------------------------------------------------------------
def _leftovers(name: str) -> list[str]:
    found = [ns for ns in kernel.namespaces() if ns.startswith(f"{PREFIX}{name}-")]
    if (CGROUP_ROOT / name).exists():
        found.append(str(CGROUP_ROOT / name))
    if (STATE_ROOT / name).exists():
        found.append(str(STATE_ROOT / name))
    return found


@needs_root
@pytest.mark.timeout(120)
def test_cpu_quota_slows_a_fixed_loop_by_its_share() -> None:
    with Testbed([{"cpu": 0.5}, {"cpu": 0.33}], name="tcpu") as bed:
        for node, cpu in ((0, 0.5), (1, 0.33)):
            check = measure_cpu(bed, node, seconds=1.5)
            assert check.stretch == pytest.approx(1 / cpu, rel=0.10), check
    assert _leftovers("tcpu") == []


@needs_root
@pytest.mark.timeout(120)
def test_a_message_crosses_the_shaped_link_at_its_rate() -> None:
    nodes = [{"link": "1gbit"}, {"link": "200mbit"}]
    with Testbed(nodes, name="tlink") as bed:
        check = measure_link(bed, 0, 1, nbytes=50_000_000, mpirun=MPIRUN)
        assert check.expected_s == pytest.approx(2.0)
        assert check.seconds == pytest.approx(2.0, rel=0.10), check
        # every byte went over the veths (TCP), none through shared memory
        assert check.sent >= 50_000_000 and check.received >= 50_000_000, check
    assert _leftovers("tlink") == []


@needs_root
@pytest.mark.timeout(60)
def test_ranks_land_on_their_nodes_with_their_names_caps_and_cores() -> None:
    # node1 pinned to the host's last CPU, node0 free to run anywhere
    last = (os.cpu_count() or 1) - 1
    nodes = [{"cpu": 1.0}, {"cpu": 0.5, "slots": 2, "cores": str(last)}]
    cpus = "taskset -pc $$ | sed 's/.*: //'"
    anywhere = subprocess.run(["sh", "-c", cpus], capture_output=True, text=True).stdout.strip()
    with Testbed(nodes, name="tplace") as bed:
        cg = "cat /proc/self/cgroup | grep -o 'hethpc-testbed/tplace/node[0-9]' | head -1"
        proc = bed.run(
            [*MPIRUN, "-np", "3", "sh", "-c", f"echo $(hostname) $({cg}) $({cpus})"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.split("\n")[:3]) == [
            f"tplace-node0 hethpc-testbed/tplace/node0 {anywhere}",
            f"tplace-node1 hethpc-testbed/tplace/node1 {last}",
            f"tplace-node1 hethpc-testbed/tplace/node1 {last}",
        ]
        one = bed.popen(1, ["sh", "-c", cpus], stdout=subprocess.PIPE, text=True)
        assert one.communicate(timeout=30)[0].strip() == str(last)


@needs_root
def test_an_exception_inside_removes_everything() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed([{"cpu": 0.5, "link": "100mbit"}], name="texc") as bed:
            bed.popen(0, ["sleep", "60"])
            raise RuntimeError("boom")
    assert _leftovers("texc") == []


_HOLDER = textwrap.dedent(
    """
    import signal, sys, time
    from hethpc.testbed import Testbed
    # Ctrl-C as in a terminal, even when the test runs in the background (SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with Testbed([{"cpu": 0.5, "link": "100mbit"}, {}], name=sys.argv[1]) as bed:
        bed.popen(0, ["sleep", "300"]); bed.popen(None, ["sleep", "300"])
        print("ready", flush=True)
        time.sleep(300)
    """
)


@needs_root
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_nothing_left_after_a_signal(sig: signal.Signals) -> None:
    name = f"tsig{sig.value}"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, name], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while not (sleepers := kernel.cgroup_pids(CGROUP_ROOT / name / "node0")):
        assert time.monotonic() < deadline, "the sleeper never joined node0's cgroup"
        time.sleep(0.05)
    assert _leftovers(name)
    holder.send_signal(sig)
    holder.wait(timeout=30)
    if sig == signal.SIGKILL:  # no chance to clean up: the next testbed to come up does
        assert _leftovers(name)
        with Testbed([{}], name="tnext"):
            pass
    assert _leftovers(name) == []
    assert not [p for p in sleepers if _alive(p)]


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie left for init to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_root
@pytest.mark.timeout(60)
def test_command_line_up_status_run_down() -> None:
    cli = [sys.executable, str(ROOT / "jobs" / "testbed.py"), "--name", "tcli"]

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)

    try:
        up = call("up", "--node", "cpu=1,link=1gbit", "--node", "cpu=0.5,link=200mbit")
        assert up.returncode == 0, up.stderr
        assert "node1  10.77.0.2" in up.stdout and "cpu=0.5 link=200mbit" in up.stdout
        again = call("up", "--node", "cpu=1")
        assert again.returncode == 2 and "already up" in again.stderr
        run = call("run", "--", *MPIRUN, "-np", "2", "hostname")
        assert sorted(run.stdout.split()) == ["tcli-node0", "tcli-node1"], run.stderr
        assert call("link", "node1", "50mbit").returncode == 0
        typo = call("link", "node7", "up")
        assert typo.returncode == 2 and "no node 'node7'" in typo.stderr
        assert "tcli-node1" not in call("status").stdout or True
        assert "10.77.0.2" in call("status").stdout
    finally:
        down = call("down")
    assert down.returncode == 0 and "is down" in down.stdout
    assert _leftovers("tcli") == []
