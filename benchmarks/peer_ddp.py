"""A peer of hethpc: plain PyTorch DistributedDataParallel over gloo, launched by Open MPI.

    scripts/mpirun.sh -np 2 .venv/bin/python benchmarks/peer_ddp.py --epochs 6
    scripts/mpirun.sh -np 2 .venv/bin/python benchmarks/peer_ddp.py --powersgd 2
    python3 jobs/testbed.py --name peers run --node cpu=1,link=1gbit \\
        --node cpu=0.5,link=200mbit -- scripts/mpirun.sh -np 2 .venv/bin/python \\
        benchmarks/peer_ddp.py --out runs/peer_ddp.json

What a user would run instead of hethpc, unchanged, so that comparisons run it beside hethpc
on the same uneven cluster: ``torch.distributed.init_process_group("gloo")`` with the rank and
world size Open MPI gives (``OMPI_COMM_WORLD_RANK``/``SIZE``), the model wrapped in
``DistributedDataParallel``, ``DistributedSampler`` shards and equal per-rank batches, training
the model and data of hethpc's demo (``jobs/demo.toml``): ``cnn1d_wide`` on the 20,000-sample
MNIST-1D that hethpc generates (80 % train, 20 % test, cached in ``$HETHPC_CACHE`` or
``~/.cache/hethpc``). Only the model factory and the data generator come from hethpc.

The rendezvous: ``MASTER_ADDR`` from ``--master-addr``, else the environment, else rank 0's
IPv4 address on an interface whose subnet holds an address of every other rank (127.0.0.1 when
all ranks share a host), found by one mpi4py allgather; ``MASTER_PORT`` likewise, else a free
port rank 0 picks and broadcasts. gloo picks its own interface by resolving the hostname unless
``GLOO_SOCKET_IFNAME`` says which; on hethpc's testbed (``HETHPC_TESTBED`` set) it defaults to
the nodes' ``eth0``. ``--powersgd RANK`` registers torch's ``powerSGD_hook`` with that matrix
approximation rank, plain allreduce for the first ``--powersgd-start`` steps (torch's advice: 10 %
of the steps); ``--fp16-compress`` registers ``fp16_compress_hook``.

``--batch-size`` is the global batch, ``--lr`` the rate for it, and ``--partition``,
``--val-fraction``, ``--eval-every-steps`` and the output as in ``benchmarks/peer_horovod.py``:
rank 0 prints one line per epoch and the summary as one JSON object on the last line, also
written to ``--out``. ``run(argv)`` trains once in a process that is already an MPI rank, for
the evidence protocol's scenarios: the process group is created at its first call and kept for
the next (``close()`` ends it).
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _peer_args import add_run_args, check_run_args, lr_schedule
from _peer_data import load_data, train_split
from _peer_eval import Evaluations
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hethpc.models import build_model

PEER = "ddp"
_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B  # Linux ioctls: an interface's IPv4 address, mask


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p)
    p.add_argument("--powersgd", type=int, default=0, metavar="RANK",
                   help="compress gradients with torch's powerSGD_hook of this matrix "
                   "approximation rank (default 0: plain allreduce)")
    p.add_argument("--powersgd-start", type=int, default=None, metavar="STEPS",
                   help="plain allreduce for this many steps before PowerSGD starts (at least "
                   "2; default: 10 %% of the steps)")
    p.add_argument("--fp16-compress", action="store_true",
                   help="send gradients in fp16 with torch's fp16_compress_hook")
    p.add_argument("--master-addr", help="rank 0's address (default: $MASTER_ADDR, else found)")
    p.add_argument("--master-port", type=int,
                   help="rank 0's port (default: $MASTER_PORT, else a free one)")
    p.add_argument("--out", type=Path, help="write the JSON summary here (rank 0)")
    args = p.parse_args(argv)
    check_run_args(p, args)
    if args.powersgd < 0:
        p.error(f"--powersgd must be a rank >= 1 (0: off), got {args.powersgd}")
    if args.powersgd and args.fp16_compress:
        p.error("--powersgd and --fp16-compress are two comm hooks; give one")
    if args.powersgd_start is not None and args.powersgd_start < 2:
        p.error(f"--powersgd-start must be at least 2 (torch's error feedback needs it), "
                f"got {args.powersgd_start}")  # fmt: skip
    return args


def ipv4_interfaces() -> dict[str, tuple[str, str]]:
    """This host's IPv4 interfaces: ``{name: (address, netmask)}``."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                addr = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24]
                mask = fcntl.ioctl(s.fileno(), _SIOCGIFNETMASK, request)[20:24]
            except OSError:  # no IPv4 address
                continue
            found[name] = (socket.inet_ntoa(addr), socket.inet_ntoa(mask))
    return found


def rendezvous(args: argparse.Namespace, rank: int) -> tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)``, the same on every rank."""
    addr = args.master_addr or os.environ.get("MASTER_ADDR")
    port = args.master_port or int(os.environ.get("MASTER_PORT", 0))
    if addr and port:
        return addr, port
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if not addr:
        everyone = world.allgather((socket.gethostname(), ipv4_interfaces()))
        addr = reachable_address(everyone)
    if not port and rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    return addr, world.bcast(port, root=0)


def reachable_address(everyone: list[tuple[str, dict[str, tuple[str, str]]]]) -> str:
    """Rank 0's address on a subnet that holds an address of every other rank.

    Args:
        everyone: every rank's ``(hostname, ipv4_interfaces())``, in rank order.
    """
    if len({host for host, _ in everyone}) == 1:
        return "127.0.0.1"
    for _, (addr, mask) in sorted(everyone[0][1].items()):
        net = ipaddress.IPv4Network(f"{addr}/{mask}", strict=False)
        if net.is_loopback:
            continue
        if all(any(ipaddress.IPv4Address(a) in net for a, _ in ifs.values())
               for _, ifs in everyone[1:]):  # fmt: skip
            return addr
    raise SystemExit("no interface of rank 0 shares a subnet with every other rank; give "
                     "--master-addr (an address of rank 0 the others reach)")  # fmt: skip


def metric_sum(values: list[float]) -> list[float]:
    """``values`` summed over the ranks."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


_master_addr = ""  # rank 0's address, once this process joined the process group


def connect(args: argparse.Namespace) -> str:
    """Join the gloo process group of the MPI job's ranks, unless this process has; rank 0's
    address."""
    global _master_addr
    if dist.is_initialized():
        return _master_addr
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    if os.environ.get("HETHPC_TESTBED"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # the nodes' link
    addr, port = rendezvous(args, rank)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=size)  # fmt: skip
    _master_addr = addr
    return addr


def close() -> None:
    """End the process group, if there is one."""
    if not dist.is_initialized():
        return
    # Once DDP wrapped a model, the process group and gloo's worker threads live until the
    # process exits; a worker that drops the last reference to a Python tensor while the
    # interpreter shuts down aborts the rank (seen on the testbed). The barrier lets the
    # workers let go of the last collective's tensors first.
    dist.barrier()
    dist.destroy_process_group()


def run(argv: Sequence[str]) -> dict[str, Any]:
    """One run with these command-line settings in a process that is already an MPI rank (a
    collective); its summary. The process group is created at the first call and reused."""
    args = parse_args(argv)
    addr = connect(args)
    return {**train(args, dist.get_rank(), dist.get_world_size()), "master_addr": addr}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    addr = connect(args)
    summary = {**train(args, dist.get_rank(), dist.get_world_size()), "master_addr": addr}
    if dist.get_rank() == 0:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print(json.dumps(summary), flush=True)
    close()
    return 0


def train(args: argparse.Namespace, rank: int, size: int) -> dict[str, Any]:
    """Train and evaluate in the process group; the summary (the same on every rank but for
    the times)."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the "
                         f"{size} ranks (every rank takes an equal batch)")  # fmt: skip
    per_rank = args.batch_size // size
    data = load_data(args, rank, dist.barrier)
    train_set, sampler = train_split(args, data, rank, size)
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler)

    model = build_model("cnn1d_wide", tuple(data.train.tensors[0].shape[1:]), 10)
    with torch.no_grad():
        model(data.train.tensors[0][:2])  # materialise the lazy layer: DDP refuses it
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    powersgd_start = None
    if args.powersgd:
        powersgd_start = args.powersgd_start or max(2, args.epochs * len(train_loader) // 10)
        state = powerSGD.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=args.powersgd,
                                       start_powerSGD_iter=powersgd_start)  # fmt: skip
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    if args.fp16_compress:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    schedule = lr_schedule(optimizer, args.lr_schedule, args.epochs * len(train_loader))
    evals = Evaluations(model, every=args.eval_every_steps or len(train_loader), test=data.test,
                        val=data.val, rank=rank, size=size, metric_sum=metric_sum)  # fmt: skip

    epochs: list[dict[str, Any]] = []
    trained = 0.0  # samples over all ranks
    step, stop = 0, False
    start = time.perf_counter()
    evals.start()
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        ddp.train()
        loss_sum = seen = 0.0
        t0 = evals.train_time()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += loss.item() * len(y)
            seen += len(y)
            step += 1
            stop = evals.after_step(step, loss.item())
            if stop:
                break
        time_s = evals.train_time() - t0
        loss_all, seen_all = metric_sum([loss_sum, seen])
        trained += seen_all
        row = {"epoch": epoch, "time_s": time_s, "train_loss": loss_all / seen_all,
               **evals.scores_at(step)}  # fmt: skip
        epochs.append(row)
        if rank == 0:
            scored = "".join(f"  {k.replace('_acc', ' accuracy')} {v:.4f}"
                             for k, v in evals.scores_at(step).items())  # fmt: skip
            print(f"epoch {epoch}  time {time_s:.2f} s  train loss {row['train_loss']:.4f}"
                  f"{scored}", flush=True)  # fmt: skip
        if stop:
            break
    train_s = sum(e["time_s"] for e in epochs)
    return {
        "peer": PEER,
        "world_size": size,
        "testbed": os.environ.get("HETHPC_TESTBED"),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "epochs": epochs,
        "total_time_s": train_s,
        "wall_s": time.perf_counter() - start,
        "samples_per_s": trained / train_s,
        "steps_per_epoch": len(train_loader),
        "steps": step,
        "per_rank_batch": per_rank,
        "val_samples": 0 if data.val is None else len(data.val),
        **evals.finish(step),
        "settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     "model": "cnn1d_wide", "powersgd_start": powersgd_start},  # fmt: skip
    }


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: gloo's threads ending while C++ statics are
    # destroyed aborted the process now and then after a finished run (seen once in ~10 test
    # runs). MPI is finalised first, so mpirun sees a clean end.
    sys.stdout.flush()
    sys.stderr.flush()
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(code)
