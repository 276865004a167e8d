"""The P x D layout of pipeline stages and data-parallel replicas over the world's ranks."""

from __future__ import annotations

from dataclasses import dataclass

from hethpc import comm
from hethpc.comm import Group
from hethpc.pipeline.errors import PipelineError


@dataclass(frozen=True)
class Layout:
    """Where a rank sits in a world of ``stages x replicas`` ranks.

    Replica ``d`` is the pipeline of consecutive world ranks ``d*P .. d*P+P-1`` (neighbouring
    stages on neighbouring ranks, so usually on one node); stage ``s`` of every replica forms
    the data-parallel group ``s, s+P, s+2P, ...``.

    Attributes:
        stages: P, ranks per pipeline.
        replicas: D, pipelines side by side.
        stage: this rank's stage.
        replica: this rank's replica (its pipeline).
    """

    stages: int
    replicas: int
    stage: int
    replica: int

    def pipeline_ranks(self, replica: int) -> tuple[int, ...]:
        """World ranks of the pipeline ``replica``, in stage order."""
        return tuple(range(replica * self.stages, (replica + 1) * self.stages))

    def replica_ranks(self, stage: int) -> tuple[int, ...]:
        """World ranks holding ``stage``, one per replica."""
        return tuple(stage + d * self.stages for d in range(self.replicas))


def pipeline_layout(stages: int, world_size: int, rank: int) -> Layout:
    """The layout of ``rank`` when ``world_size`` ranks run pipelines of ``stages`` stages.

    Raises:
        PipelineError: ``stages`` is below 1 or does not divide ``world_size``.
    """
    if stages < 1 or world_size % stages != 0:
        raise PipelineError(
            f"stages = {stages} must be at least 1 and divide the world size {world_size} "
            f"(world = stages x replicas); launch a multiple of {max(stages, 1)} ranks or "
            "change the number of stages"
        )
    return Layout(stages, world_size // stages, rank % stages, rank // stages)


@dataclass(frozen=True)
class PipelineGroups:
    """This rank's groups: its pipeline (``stage_group``) and its stage's replicas.

    ``stage_group.rank`` is this rank's stage; ``dp_group`` is None when there is one replica.
    """

    layout: Layout
    stage_group: Group
    dp_group: Group | None


def make_pipeline_groups(stages: int, world_size: int | None = None) -> PipelineGroups:
    """Create the pipeline and replica groups; every world rank calls it, with the same args.

    Args:
        stages: P, ranks per pipeline.
        world_size: must equal the world's size (default: it); a check against mistakes.

    Raises:
        PipelineError: the world cannot be cut into pipelines of ``stages`` ranks.
    """
    n = comm.size()
    if world_size is not None and world_size != n:
        raise PipelineError(f"world_size {world_size} differs from the world's size {n}")
    layout = pipeline_layout(stages, n, comm.rank())
    stage_group = dp_group = None
    # new_group is collective over the world: every rank creates every group, in one order.
    for d in range(layout.replicas):
        g = _group(layout.pipeline_ranks(d))
        if d == layout.replica:
            stage_group = g
    if layout.replicas > 1:
        for s in range(layout.stages):
            g = _group(layout.replica_ranks(s))
            if s == layout.stage:
                dp_group = g
    assert stage_group is not None
    return PipelineGroups(layout, stage_group, dp_group)


def _group(ranks: tuple[int, ...]) -> Group:
    if len(ranks) == 1:
        # A one-rank group never communicates: no MPI communicator, no Horovod process set.
        r = ranks[0]
        return Group(ranks, 0 if comm.rank() == r else -1)
    return comm.new_group(ranks)
