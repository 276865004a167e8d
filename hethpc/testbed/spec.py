"""Node descriptions of a testbed: CPU share, host cores, link rate and slots, parsed from TOML or
flags."""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hethpc.testbed.errors import SpecError

# tc's bit-rate units; "bps" means bytes per second to tc, bits to most people: refused.
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]+)(?:/s)?\s*$", re.IGNORECASE)
_KEYS = ("cpu", "cores", "link", "slots")
_CORES = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")


def parse_rate(text: str | int | float) -> int:
    """A link rate in bits per second from ``"200mbit"``, ``"1gbit"``, ``"1.5Gbit/s"`` or a number
    of bits per second.

    Raises:
        SpecError: not a positive rate with one of tc's bit units.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), "bit"
    else:
        m = _RATE.match(str(text))
        if not m or m.group(2).lower() not in _RATE_UNITS:
            raise SpecError(
                f"link rate {text!r} is not a rate: write a number and one of "
                f"{', '.join(_RATE_UNITS)} (bits per second), e.g. '200mbit' or '1gbit'"
            )
        value, unit = float(m.group(1)), m.group(2).lower()
    bits = value * _RATE_UNITS[unit]
    if not (math.isfinite(bits) and bits >= 8000):
        raise SpecError(f"link rate {text!r} must be at least 8kbit")
    return int(round(bits))


def format_rate(bits: int) -> str:
    """``200000000`` -> ``"200mbit"`` (tc's notation; the largest unit that divides it)."""
    for unit, scale in sorted(_RATE_UNITS.items(), key=lambda kv: -kv[1]):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True)
class NodeSpec:
    """One node of a testbed.

    Attributes:
        cpu: the node's CPU time in cores (0.5: half of one core, enforced by a CFS quota on
            all its processes together); None: no cap.
        cores: the host CPUs its processes may run on (their affinity, as a real node's own
            cores); None: any. ``cpu`` is then a share of these.
        link: the rate of the node's link to the switch in bits per second, shaped in both
            directions; None: unshaped (as fast as the host moves bytes).
        slots: the ranks ``mpirun`` places on the node (its hostfile slots).
    """

    cpu: float | None = None
    link: int | None = None
    slots: int = 1
    cores: tuple[int, ...] | None = None

    def describe(self) -> str:
        """``cpu=0.5 link=200mbit slots=1`` (and ``cores=1`` when pinned)."""
        cpu = "none" if self.cpu is None else f"{self.cpu:g}"
        link = "none" if self.link is None else format_rate(self.link)
        pinned = "" if self.cores is None else f" cores={format_cores(self.cores)}"
        return f"cpu={cpu}{pinned} link={link} slots={self.slots}"


def format_cores(cores: Sequence[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2 5"`` as a node is written, ``taskset``'s list with commas."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return " ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def parse_cores(raw: Any, *, where: str, host: int) -> tuple[int, ...]:
    """A node's host CPUs from ``"1"``, ``"0-3"``, ``"0-1 4"`` (flags: no commas) or a list of
    numbers (TOML, JSON), each below the host's CPU count.

    Raises:
        SpecError: not such a list, a CPU the host lacks, or one given twice.
    """
    parts = raw if isinstance(raw, list) else str(raw).split()
    cores: list[int] = []
    for part in parts:
        m = _CORES.match(str(part))  # True, 1.5 and "a" alike fail it
        if not m:
            raise SpecError(f"{where}: cores {raw!r} is not a list of host CPUs: write e.g. "
                            "'1', '0-3' or '0-1 4' (a list [0, 1, 4] in TOML)")  # fmt: skip
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        cores += range(lo, hi + 1)
    if not cores or len(set(cores)) != len(cores):
        raise SpecError(f"{where}: cores {raw!r} must name each host CPU once, at least one")
    beyond = [c for c in cores if c >= host]
    if beyond:
        raise SpecError(f"{where}: cores {raw!r}: this host has CPUs 0-{host - 1}, not {beyond}")
    return tuple(sorted(cores))


def node_spec(raw: Mapping[str, Any], *, where: str, cores: int | None = None) -> NodeSpec:
    """One node from a mapping such as ``{"cpu": 0.5, "link": "200mbit"}``.

    Args:
        raw: keys ``cpu`` (cores, or "none"), ``cores`` (host CPUs), ``link`` (a rate, or
            "none"), ``slots``.
        where: names the node in errors (``node 1 of nodes.toml``).
        cores: the host's CPU count, the largest ``cpu`` (default: ``os.cpu_count()``).

    Raises:
        SpecError: an unknown key or a value out of range.
    """
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {unknown}; a node takes {', '.join(_KEYS)}")
    cores = cores or os.cpu_count() or 1
    cpu = raw.get("cpu")
    if cpu is not None and str(cpu).lower() != "none":
        try:
            cpu = float(cpu)
        except (TypeError, ValueError):
            raise SpecError(f"{where}: cpu {cpu!r} is not a number of cores (e.g. 0.5)") from None
        if not (0.01 <= cpu <= cores):
            raise SpecError(
                f"{where}: cpu {cpu:g} is out of range: give 0.01 to {cores} cores (this host "
                "has {cores}), or 'none' for no cap".replace("{cores}", str(cores))
            )
    else:
        cpu = None
    pinned = raw.get("cores")
    if pinned is not None and str(pinned).lower() != "none":
        pinned = parse_cores(pinned, where=where, host=cores)
        if cpu is not None and cpu > len(pinned):
            raise SpecError(f"{where}: cpu {cpu:g} is more than its {len(pinned)} core(s) "
                            f"{format_cores(pinned)!r} can give; give cpu <= {len(pinned)} or "
                            "more cores")  # fmt: skip
    else:
        pinned = None
    link = raw.get("link")
    link = None if link is None or str(link).lower() == "none" else parse_rate(link)
    slots = raw.get("slots", 1)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise SpecError(f"{where}: slots must be a whole number >= 1, got {slots!r}")
    return NodeSpec(cpu=cpu, link=link, slots=slots, cores=pinned)


def parse_flag(text: str, *, where: str) -> dict[str, str]:
    """``"cpu=0.5,link=200mbit"`` -> ``{"cpu": "0.5", "link": "200mbit"}``."""
    out: dict[str, str] = {}
    key = ""
    for part in filter(None, (p.strip() for p in text.split(","))):
        if key == "cores" and "=" not in part:
            raise SpecError(f"{where}: cores takes a range or a list with spaces in a flag "
                            "('cores=0-1', 'cores=0 2'), not commas")  # fmt: skip
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise SpecError(
                f"{where}: {part!r} is not key=value; write e.g. 'cpu=0.5,link=200mbit,slots=1'"
            )
        out[key.strip()] = value.strip()
    if "slots" in out:
        try:
            return {**out, "slots": int(out["slots"])}  # type: ignore[dict-item]
        except ValueError:
            raise SpecError(f"{where}: slots {out['slots']!r} is not a whole number") from None
    return out


def load_nodes(source: str | Path | Sequence[Mapping[str, Any]]) -> list[NodeSpec]:
    """The nodes of a testbed from a TOML file (``[[node]]`` tables), a JSON list, or a list of
    mappings.

    Raises:
        SpecError: the file is missing or malformed, or a node is invalid (named by position).
    """
    where = "nodes"
    if isinstance(source, (str, Path)):
        text = str(source).strip()
        if text.startswith("["):
            try:
                raw: Any = json.loads(text)
            except json.JSONDecodeError as e:
                raise SpecError(f"--nodes {text!r} is not a JSON list of nodes: {e}") from None
        else:
            path = Path(source)
            where = str(path)
            if not path.is_file():
                raise SpecError(f"node file {path} does not exist (a TOML file of [[node]] tables)")
            try:
                raw = tomllib.loads(path.read_text()).get("node")
            except tomllib.TOMLDecodeError as e:
                raise SpecError(f"{path} is not valid TOML: {e}") from None
            if raw is None:
                raise SpecError(f"{path} has no [[node]] tables; write one per node")
    else:
        raw = source
    if not isinstance(raw, list) or not raw or not all(isinstance(n, Mapping) for n in raw):
        raise SpecError(f"{where}: expected a non-empty list of nodes, got {raw!r}")
    return [node_spec(n, where=f"node {i} of {where}") for i, n in enumerate(raw)]
