"""Process groups: a Horovod process set and an mpi4py communicator over the same ranks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hethpc.comm.errors import CommError
from hethpc.comm.runtime import state


@dataclass(frozen=True)
class Group:
    """A set of world ranks that communicate among themselves.

    Attributes:
        ranks: world ranks in the group, in group-rank order.
        rank: this process's rank inside the group, or -1 when it is not a member.
        mpi_comm: the mpi4py communicator (None in a size-1 world or for non-members).
        process_set: the Horovod process set (None in a size-1 world).
    """

    ranks: tuple[int, ...]
    rank: int
    mpi_comm: Any = None
    process_set: Any = None

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the group."""
        return self.rank >= 0


_world: Group | None = None
# Horovod refuses a second process set over the same ranks, so sets are shared by rank set.
_process_sets: dict[tuple[int, ...], Any] = {}


def world() -> Group:
    """The group of all ranks."""
    global _world
    st = state()
    if _world is None:
        mpi_comm = st.mpi.COMM_WORLD if st.mpi is not None else None
        ps = st.hvd.global_process_set if st.hvd is not None else None
        _world = Group(tuple(range(st.size)), st.rank, mpi_comm, ps)
    return _world


def resolve(group: Group | None) -> Group:
    """``group``, or the world when it is None; refuses a group this rank is not in."""
    g = world() if group is None else group
    if not g.is_member:
        raise CommError(
            f"rank {state().rank} called a collective on group {list(g.ranks)}, which it is not "
            "a member of; only members may communicate in a group"
        )
    return g


def new_group(ranks: Sequence[int]) -> Group:
    """Create a group over ``ranks``; every world rank must call it, in the same order.

    Args:
        ranks: distinct world ranks, in the order that defines group ranks.

    Returns:
        The group; on ranks outside it, a non-member handle (``rank == -1``).

    Raises:
        ValueError: ranks are empty, repeated or outside the world.
    """
    st = state()
    members = tuple(int(r) for r in ranks)
    if not members or len(set(members)) != len(members):
        raise ValueError(f"group ranks must be distinct and non-empty, got {list(ranks)}")
    bad = [r for r in members if not 0 <= r < st.size]
    if bad:
        raise ValueError(f"group ranks {bad} are outside the world of size {st.size}")
    my = members.index(st.rank) if st.rank in members else -1
    if st.size == 1:
        return Group(members, my)
    mpi = st.mpi
    wc = mpi.COMM_WORLD
    comm = wc.Create(wc.Get_group().Incl(list(members)))
    key = tuple(sorted(members))
    if st.hvd is None:  # transport "mpi": the communicator carries everything
        ps = None
    elif key == tuple(range(st.size)):
        ps = st.hvd.global_process_set
    elif key in _process_sets:
        ps = _process_sets[key]
    else:
        ps = _process_sets[key] = st.hvd.add_process_set(list(key))
    return Group(members, my, comm if comm != mpi.COMM_NULL else None, ps)
