"""The evidence protocol's arithmetic (docs/evaluation.md), apart from any training: time to a
target without interpolation, the choice of a setting, medians with their spread."""

from __future__ import annotations

import json
import math
import statistics
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hethpc.testbed import SpecError, load_nodes
from hethpc.testbed.spec import parse_flag

Curve = Sequence[tuple[float, float]]  # (seconds without evaluations, metric), in order

METHOD_KEYS = ("knob", "values", "peer")
SCENARIO_KEYS = ("description", "ranks", "methods")  # every scenario's
NOT_SETTINGS = (*SCENARIO_KEYS, "testbed")  # a scenario's keys that are not TrainConfig's
PEERS = ("horovod", "ddp")  # benchmarks/peer_<name>.py
PEER_KEYS = {"peer", "compression", "knob", "values"}  # what a peer method may set
# What a peer runs (benchmarks/peer_*.py): the demo's model and data, these partitions, and no
# emulation (hethpc's own; a peer is slowed only by a testbed's quotas and links).
PEER_RUNS = {"model": ("cnn1d_wide",), "data": ("mnist1d",), "partition": ("iid", "labels"),
             "lr_schedule": ("constant", "wsd")}  # fmt: skip
EMULATION = ("slowdown", "link")
FROZEN_KEYS = ("target", "chosen", "target_finals", "target_setting")  # --frozen
PROTOCOL_KEYS = (
    "margin", "eval_every_samples", "tune_seed", "target_seeds", "seeds", "lr", "batch",
)  # fmt: skip


@dataclass(frozen=True)
class Metric:
    """What a workload's evaluations score (``[protocol] metric``): the summary's and the
    records' ``val_<key>`` / ``test_<key>``, and which way is better."""

    key: str
    higher: bool  # higher is better (accuracy); else lower (bits per byte)
    name: str  # in words, for the tables
    diverged: float | None  # the final score of a run that diverged

    def target(self, median: float, margin: float) -> float:
        """``margin`` worse than ``median``."""
        return median - margin if self.higher else median + margin

    def reaches(self, value: float, target: float) -> bool:
        return value >= target if self.higher else value <= target

    def rank(self, value: float | None) -> float:
        """Larger is better; a missing value is the worst."""
        if value is None:
            return -math.inf
        return value if self.higher else -value

    def show(self, value: float) -> str:
        return f"{100 * value:.2f} %" if self.key == "acc" else f"{value:.3f} {self.key}"


METRICS = {
    "acc": Metric("acc", True, "validation accuracy", 0.0),
    "bpb": Metric("bpb", False, "validation bits per byte", None),
}


def metric_of(protocol: Mapping[str, Any]) -> Metric:
    """The workload's metric (accuracy unless ``[protocol] metric`` says otherwise)."""
    return METRICS[protocol.get("metric", "acc")]


def first_reaching(curve: Curve, target: float, metric: Metric = METRICS["acc"]) -> float | None:
    """The time of the first evaluation at or past ``target`` (at or above it for accuracy, at
    or below it for bits per byte; no interpolation); None if no evaluation reaches it."""
    for t, v in curve:
        if metric.reaches(v, target):
            return t
    return None


def pick(candidates: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The candidate with the earliest ``tta`` (seconds to the target on validation; None:
    never), ties and all-never broken by the larger ``final`` (the final validation score as
    :meth:`Metric.rank` orders it)."""
    if not candidates:
        raise ValueError("no candidates to pick from")
    return min(
        candidates,
        key=lambda c: (math.inf if c["tta"] is None else c["tta"], -c["final"]),
    )


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min and max of the values that exist, and how many of all exist."""
    got = [v for v in values if v is not None]
    return {
        "median": statistics.median(got) if got else None,
        "min": min(got) if got else None,
        "max": max(got) if got else None,
        "n": len(got),
        "of": len(values),
    }


def eval_every_steps(samples: int, batch: int) -> int:
    """Steps between evaluations so that every method is evaluated every ``samples`` samples."""
    return max(1, round(samples / batch))


def load_workload(path: Path) -> dict[str, Any]:
    """A workload file: ``[base]`` settings, ``[protocol]``, ``[methods.*]``, ``[scenarios.*]``.

    Raises:
        SystemExit: a missing part or key, a scenario naming an unknown method, an unknown
            peer, a peer in a scenario with emulation, or a bad testbed (one line naming the
            file and the key).
    """
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"{path}: cannot read the workload: {e}") from None
    for part in ("base", "protocol", "methods", "scenarios"):
        if not isinstance(data.get(part), dict) or not data[part]:
            raise SystemExit(f"{path}: the workload needs a [{part}] table")
    for key in PROTOCOL_KEYS:
        if key not in data["protocol"]:
            raise SystemExit(f"{path}: [protocol] needs {key}")
    convert = data.get("prepare", {}).get("convert")
    if convert is not None and (not isinstance(convert, list) or "--out" not in convert[:-1]):
        raise SystemExit(f"{path}: [prepare] convert must be hethpc-convert's arguments as a "
                         f"list with --out OUT, e.g. [\"text\", \"--out\", \"data/t\"]; "
                         f"got {convert!r}")  # fmt: skip
    if data["protocol"].get("metric", "acc") not in METRICS:
        raise SystemExit(f"{path}: [protocol] metric = {data['protocol']['metric']!r}; choose "
                         f"one of {', '.join(map(repr, METRICS))}")  # fmt: skip
    for name, m in data["methods"].items():
        if ("knob" in m) != ("values" in m) or ("values" in m and not m["values"]):
            raise SystemExit(f"{path}: [methods.{name}] needs knob and values together")
        if "peer" in m and m["peer"] not in PEERS:
            raise SystemExit(f"{path}: [methods.{name}] peer = {m['peer']!r} is not a peer; "
                             f"the peers are {', '.join(map(repr, PEERS))}")  # fmt: skip
        if "peer" in m and (set(m) - PEER_KEYS or m.get("knob", "compression") != "compression"):
            raise SystemExit(f"{path}: [methods.{name}] is the peer {m['peer']!r}: it takes no "
                             "hethpc settings but compression (its own: horovod fp16, ddp "
                             f"powersgd), got {sorted(set(m) - {'peer'})}")  # fmt: skip
        if "peer" in m and name.split("_")[0] != m["peer"]:
            raise SystemExit(f"{path}: [methods.{name}] is the peer {m['peer']!r}: name it "
                             f"{m['peer']} or {m['peer']}_SOMETHING")  # fmt: skip
    for name, s in data["scenarios"].items():
        for key in SCENARIO_KEYS:
            if key not in s:
                raise SystemExit(f"{path}: [scenarios.{name}] needs {key}")
        unknown = sorted(set(s["methods"]) - set(data["methods"]))
        if unknown:
            raise SystemExit(
                f"{path}: [scenarios.{name}] names unknown methods {unknown}; define them as "
                "[methods.NAME]"
            )
        if "bsp" not in s["methods"]:
            raise SystemExit(f"{path}: [scenarios.{name}] needs the baseline method bsp")
        _check_testbed(path, name, s)
        peers = [m for m in s["methods"] if "peer" in data["methods"][m]]
        if peers:
            _check_peers(path, name, peers, {**data["base"], **scenario_settings(s)})
    for name, prof in data.get("profiles", {}).items():
        _check_profile(path, name, prof, data["scenarios"])
    return data


def _check_profile(path: Path, name: str, prof: Any, scenarios: Mapping[str, Any]) -> None:
    """A ``[profiles.NAME]``: a description and, per scenario it runs, the methods it runs
    there (a subset of the scenario's own, BSP among them)."""
    where = f"{path}: [profiles.{name}]"
    runs = prof.get("scenarios") if isinstance(prof, dict) else None
    if not isinstance(prof, dict) or "description" not in prof or not isinstance(runs, dict) \
            or not runs:
        raise SystemExit(f"{where} needs a description and [profiles.{name}.scenarios] with "
                         'the methods per scenario, e.g. demo = ["bsp", "bsp_dynamic"]')
    for scen, methods in runs.items():
        if scen not in scenarios:
            raise SystemExit(f"{where} names the scenario {scen!r}, which the workload lacks; "
                             f"it has {', '.join(scenarios)}")  # fmt: skip
        extra = [m for m in methods if m not in scenarios[scen]["methods"]]
        if extra or "bsp" not in methods:
            raise SystemExit(f"{where} {scen} = {methods!r}: take methods the scenario runs "
                             f"({', '.join(scenarios[scen]['methods'])}), bsp among them "
                             "(its runs fix the target)")  # fmt: skip


def _check_testbed(path: Path, name: str, scenario: Mapping[str, Any]) -> None:
    """A scenario's ``testbed``: node specs as ``jobs/testbed.py --node`` takes them, as many
    ranks as the nodes have slots."""
    if "testbed" not in scenario:
        return
    where = f"{path}: [scenarios.{name}] testbed"
    specs = scenario["testbed"]
    if not isinstance(specs, list) or not specs or not all(isinstance(n, str) for n in specs):
        raise SystemExit(
            f'{where} must be a list of node specs, e.g. ["cpu=1,link=200mbit", '
            f'"cpu=0.5,link=200mbit"]; got {specs!r}'
        )
    try:
        nodes = load_nodes([parse_flag(n, where=f"{where} {n!r}") for n in specs])
    except SpecError as e:
        raise SystemExit(f"{where}: {e}") from None
    slots = sum(n.slots for n in nodes)
    if scenario["ranks"] != slots:
        raise SystemExit(f"{where} has {slots} slots for ranks = {scenario['ranks']}; make "
                         "them equal (one rank per node unless a node says slots=N)")  # fmt: skip


def _check_peers(path: Path, name: str, peers: list[str], settings: Mapping[str, Any]) -> None:
    """A scenario that lists peers runs what they can run, without hethpc's emulation."""
    emulated = {k: settings[k] for k in EMULATION if settings.get(k)}
    if emulated:
        raise SystemExit(
            f"{path}: [scenarios.{name}] lists the peers {peers} but emulates {emulated}; a "
            "peer cannot be slowed by hethpc's emulation: run peers in a testbed scenario "
            '(testbed = [...]) or one without emulation (slowdown = "", link = "")'
        )
    for key, allowed in PEER_RUNS.items():
        if key in settings and settings[key] not in allowed:
            raise SystemExit(f"{path}: [scenarios.{name}] lists the peers {peers}, which run "
                             f"{key} {' or '.join(allowed)}, not {settings[key]!r}")  # fmt: skip


def method_settings(method: Mapping[str, Any], knob_value: Any = None) -> dict[str, Any]:
    """A method's TrainConfig settings, its knob at ``knob_value`` (None: its first value)."""
    kw = {k: v for k, v in method.items() if k not in METHOD_KEYS}
    if "knob" in method:
        kw[method["knob"]] = method["values"][0] if knob_value is None else knob_value
    return kw


def converted_out(work: Mapping[str, Any]) -> str | None:
    """The folder ``[prepare] convert`` writes (its ``--out``); None: nothing to convert."""
    convert = work.get("prepare", {}).get("convert")
    return None if convert is None else convert[convert.index("--out") + 1]


def scenario_settings(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario's TrainConfig settings."""
    return {k: v for k, v in scenario.items() if k not in NOT_SETTINGS}


def load_frozen(path: Path, names: Sequence[str], work: Mapping[str, Any]) -> dict[str, Any]:
    """Each scenario's frozen choices from an earlier run: ``path`` holds that run's last JSON
    line (its ``detail``) or ``{scenario: {"target", "chosen", "target_finals",
    "target_setting", "from"}}``; every scenario in ``names`` and each of its methods must be
    there.

    Raises:
        SystemExit: an unreadable file, a missing scenario, method or key (one line naming the
            file and what is missing).
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read the frozen choices: {e}") from None
    data = data.get("detail", data) if isinstance(data, dict) else None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: the frozen choices must be a JSON object of scenarios")
    out = {}
    for name in names:
        frozen = data.get(name)
        if not isinstance(frozen, dict):
            raise SystemExit(f"{path}: no frozen choices for the scenario {name}; it has "
                             f"{', '.join(sorted(data)) or 'none'}")  # fmt: skip
        for key in FROZEN_KEYS:
            if key not in frozen:
                raise SystemExit(f"{path}: [{name}] needs {key!r} (an earlier run's)")
        for m in work["scenarios"][name]["methods"]:
            c = frozen["chosen"].get(m)
            if not isinstance(c, dict) or {"lr", "batch", "knob"} - set(c):
                raise SystemExit(f"{path}: [{name}] chose nothing for the method {m} (needs "
                                 "lr, batch and knob); measure the methods it has with "
                                 "--methods")  # fmt: skip
        out[name] = frozen
    return out


def compute_probe_ms(repeats: int = 1000, size: int = 192) -> float:
    """Milliseconds this process takes for a fixed piece of compute (``repeats`` float32
    matrix products of ``size`` x ``size`` on one thread), the best of 3: the same work
    before every measuring run, so that a host whose speed drifts during a run of the
    protocol shows it (an emulated slowdown does not touch it)."""
    import torch

    a = torch.ones(size, size) / size
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        b = a
        for _ in range(repeats):
            b = (b @ a).contiguous()
        best = min(best, time.perf_counter() - t0)
    return 1000 * best


def probe_drift(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """One sentence on the compute probes of a scenario's measuring runs (their
    ``probe_ms``, one value per rank): the slowest rank's median and range, and how much
    slower the slowest run's probe was than the fastest's; '' without probes."""
    worst = [max(r["probe_ms"]) for rs in runs.values() for r in rs if r.get("probe_ms")]
    if not worst:
        return ""
    lo, hi = min(worst), max(worst)
    return (f"Host speed: the same compute before each measuring run took "
            f"{statistics.median(worst):.1f} ms [{lo:.1f}..{hi:.1f}] on the slower rank, the "
            f"slowest run's {hi / lo:.2f}x the fastest's (a host that drifts moves every "
            "method's time).")  # fmt: skip

