"""A heterogeneous cluster on this host, enforced by the kernel: bring it up, run on it, down.

    hethpc-testbed up --node cpu=1,link=1gbit --node cpu=0.5,link=200mbit
    hethpc-testbed run -- scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --epochs 2
    hethpc-testbed status
    hethpc-testbed link node1 50mbit        # or: down, up, none
    hethpc-testbed down

``run`` on a testbed that is not up brings one up from ``--node``/``--nodes``, runs the command
and takes it down again (also on Ctrl-C). Needs root on Linux; ``docs/testbed.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from hethpc.cli.parser import ArgumentParser, command_name
from hethpc.testbed import SpecError, Testbed, TestbedError, load_nodes, running
from hethpc.testbed.spec import parse_flag


def _nodes(args: argparse.Namespace) -> list[Any] | None:
    if args.nodes and args.node:
        raise SpecError("give the nodes by --nodes FILE or by --node flags, not both")
    if args.nodes:
        return list(load_nodes(args.nodes))
    if args.node:
        return list(load_nodes([parse_flag(f, where=f"--node {f!r}") for f in args.node]))
    return None


def _node_index(bed: Testbed, text: str) -> int:
    """``node1``, ``1``, ``<name>-node1`` or an address -> 1."""
    for i in range(len(bed.nodes)):
        if text in (str(i), f"node{i}", bed.hostname(i), bed.address(i)):
            return i
    raise TestbedError(
        f"testbed {bed.name} has no node {text!r}; its nodes are node0..node{len(bed.nodes) - 1}"
    )


def _print_status(bed: Testbed) -> None:
    st = bed.status()
    print(f"testbed {st['name']}: head {st['head']} (run commands there: hethpc-testbed run)")
    for n in st["nodes"]:
        moved = (
            f"  rx {n['rx']:,} B  tx {n['tx']:,} B  processes {n['processes']}" if "rx" in n else ""
        )
        print(f"  node{n['node']}  {n['address']:<12} {n['spec']:<40}{moved}")


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog=command_name(argv, "hethpc-testbed"), description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Node keys: cpu (cores, e.g. 0.5; 'none'), cores (the host CPUs it runs on, e.g. "
        "1 or 0-3; default any), link (e.g. 200mbit, 1gbit; 'none'), slots (ranks mpirun "
        "places there, default 1).",
    )  # fmt: skip
    p.add_argument("--name", default="tb", help="the testbed's name (default: tb)")
    sub = p.add_subparsers(dest="cmd", required=True)

    def nodes_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--node", action="append", default=[], metavar="K=V,...",
                       help="one node, e.g. cpu=0.5,link=200mbit (repeat per node)")  # fmt: skip
        q.add_argument("--nodes", metavar="FILE|JSON",
                       help="a TOML file of [[node]] tables, or a JSON list of nodes")  # fmt: skip
        q.add_argument("--period-ms", type=float, default=100.0,
                       help="CFS period of the CPU quotas, ms (default 100)")  # fmt: skip

    def command(name: str, help: str) -> argparse.ArgumentParser:
        # --name after the sub-command too (``up --name mine``), as before it
        q = sub.add_parser(name, help=help)
        q.add_argument("--name", default=argparse.SUPPRESS,
                       help="the testbed's name (default: tb)")  # fmt: skip
        return q

    up = command("up", "bring a testbed up and leave it up")
    nodes_args(up)
    run = command("run", "run a command on the head (mpirun there spans the nodes)")
    nodes_args(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    command("status", "the testbeds that are up, their nodes and bytes moved")
    command("down", "end every process on it and remove it")
    link = command("link", "change a node's link: a rate, 'down', 'up' or 'none'")
    link.add_argument("node")
    link.add_argument("rate")
    cpu = command("cpu", "change a node's CPU cap in cores ('none': no cap)")
    cpu.add_argument("node")
    cpu.add_argument("cores")
    kill = command("kill", "kill every process on a node (a crashed node)")
    kill.add_argument("node")
    args = p.parse_args(argv)
    try:
        return _dispatch(args, p)
    except (SpecError, TestbedError) as e:
        print(f"hethpc-testbed: {e}", file=sys.stderr)
        return 2
    except subprocess.SubprocessError as e:  # a command it ran failed or timed out
        print(f"hethpc-testbed: {e}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    if args.cmd == "up":
        nodes = _nodes(args)
        if nodes is None:
            p.error("up needs the nodes: --node cpu=..,link=.. (per node) or --nodes FILE")
        bed = Testbed(nodes, name=args.name, period_ms=args.period_ms, persistent=True).up()
        _print_status(bed)
        named = "" if args.name == "tb" else f" --name {args.name}"
        print(f"take it down with: hethpc-testbed{named} down")
        return 0
    if args.cmd == "run":
        cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not cmd:
            p.error("run needs a command after --, e.g. run -- mpirun -np 2 hostname")
        nodes = _nodes(args)
        if nodes is None:
            return Testbed.attach(args.name).run(cmd).returncode
        with Testbed(nodes, name=args.name, period_ms=args.period_ms) as bed:
            try:
                return bed.run(cmd).returncode
            except KeyboardInterrupt:
                return 130
    if args.cmd == "status":
        beds = running()
        if not beds:
            print("no testbed is up")
        for name in sorted(beds):
            try:
                _print_status(Testbed.attach(name))
            except TestbedError:
                print(f"testbed {name}: partly present ({json.dumps(beds[name]) or 'no state'}); "
                      f"remove it with: hethpc-testbed --name {name} down")  # fmt: skip
        return 0
    up = args.cmd != "down" or args.name in running()
    found: Testbed | None = Testbed.attach(args.name) if up else None
    if args.cmd == "down":
        if found is None:
            print(f"no testbed named {args.name!r} is up")
            return 0
        found.down()
        print(f"testbed {args.name} is down")
        return 0
    assert found is not None
    bed = found
    node = _node_index(bed, args.node)
    if args.cmd == "link":
        rate = args.rate.lower()
        if rate in ("down", "up"):
            bed.set_link_up(node, rate == "up")
        else:
            bed.set_link(node, None if rate == "none" else rate)
    elif args.cmd == "cpu":
        try:
            cores = None if args.cores.lower() == "none" else float(args.cores)
        except ValueError:
            raise SpecError(
                f"cpu {args.cores!r} is not a number of cores (e.g. 0.5) or 'none'"
            ) from None
        bed.set_cpu(node, cores)
    elif args.cmd == "kill":
        bed.kill(node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
