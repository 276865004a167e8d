"""A pipelined model gives the loss and gradients of the same model run in one process.

Configurations (stages P x replicas D) that do not match the world size are skipped, so one
file covers P=2 on 2 ranks, P=3 on 3 ranks, P=2 x D=2 on 4 ranks, and P=1 in a plain process.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.pipeline import Pipeline, PipelineError, build_pipeline
from hethpc.pipeline.groups import PipelineGroups, make_pipeline_groups
from hethpc.pipeline.memory import ActivationMeter
from hethpc.pipeline.schedule import peak_in_flight

WIDTH = 12
# (stages, replicas, balance): layers per stage of the 7-layer model below.
CONFIGS = [
    pytest.param(1, 1, (7,), id="P1"),
    pytest.param(1, 2, (7,), id="P1xD2"),
    pytest.param(2, 1, (3, 4), id="P2"),
    pytest.param(3, 1, (2, 2, 3), id="P3"),
    pytest.param(2, 2, (4, 3), id="P2xD2"),
    pytest.param(4, 1, (2, 2, 2, 1), id="P4"),
]
SCHEDULES = ["gpipe", "1f1b", "zb"]
ZBV_CONFIGS = [
    pytest.param(1, 1, (3, 4), id="P1"),
    pytest.param(2, 1, (2, 2, 2, 1), id="P2"),
    pytest.param(3, 1, (1, 1, 2, 1, 1, 1), id="P3"),
    pytest.param(2, 2, (2, 1, 2, 2), id="P2xD2"),
]
# every schedule with its stage layouts (zbv cuts 2P chunks)
SCHEDULE_CASES = [
    *(pytest.param(s, *c.values, id=f"{s}-{c.id}") for s in SCHEDULES for c in CONFIGS),
    *(pytest.param("zbv", *c.values, id=f"zbv-{c.id}") for c in ZBV_CONFIGS),
]
_groups: dict[int, PipelineGroups] = {}


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, WIDTH),
        nn.Tanh(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.Tanh(),
        nn.Linear(WIDTH, 4),
    )


def make_batch(rows: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 4, (rows,), generator=g)


def groups_for(stages: int, replicas: int) -> PipelineGroups:
    if stages * replicas != comm.size():
        need = stages * replicas
        pytest.skip(f"P={stages} x D={replicas} needs {need} ranks, world has {comm.size()}")
    if stages not in _groups:
        _groups[stages] = make_pipeline_groups(stages)
    return _groups[stages]


def reference_grads(x: torch.Tensor, y: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    ref = make_model()
    loss = nn.functional.cross_entropy(ref(x), y)
    loss.backward()
    return loss.item(), {k: p.grad for k, p in ref.named_parameters()}


def stage_grads(pipe: Pipeline) -> dict[str, torch.Tensor]:
    """The stage's gradients under the whole model's parameter names."""
    offset = sum(pipe.balance[: pipe.stage])
    out = {}
    for k, p in pipe.module.named_parameters():
        layer, name = k.split(".", 1)
        assert p.grad is not None, f"stage {pipe.stage}: no gradient for {k}"
        out[f"{int(layer) + offset}.{name}"] = p.grad
    return out


def expected_names(pipe: Pipeline) -> set[str]:
    lo = sum(pipe.balance[: pipe.stage])
    hi = lo + pipe.balance[pipe.stage]
    return {k for k, _ in make_model().named_parameters() if lo <= int(k.split(".")[0]) < hi}


ROW_CASES = [  # (rows per replica, micro-batches, checkpoint)
    pytest.param(16, 4, False, id="16rows-m4"),
    pytest.param(10, 4, False, id="10rows-m4-uneven"),
    pytest.param(12, 3, True, id="12rows-m3-recompute"),
]


def train_replica_slice(
    pipe: Pipeline, groups: PipelineGroups, rows: int, replicas: int
) -> tuple[float | None, float, dict[str, torch.Tensor]]:
    """Two steps of ``pipe`` on its replica's ``rows`` of one batch; ``(loss, the loss of that
    slice in one process, the whole batch's gradients in one process)`` (replicas average to
    the whole batch's gradient)."""
    x, y = make_batch(rows * replicas)
    d = groups.layout.replica
    xd, yd = x[d * rows : (d + 1) * rows], y[d * rows : (d + 1) * rows]
    for _ in range(2):  # a second step reuses the tags and must give the same result
        pipe.module.zero_grad()
        loss = pipe.train_step(xd, yd, nn.functional.cross_entropy)
    ref_loss, _ = reference_grads(xd, yd)
    _, ref = reference_grads(x, y)
    return loss, ref_loss, ref


def assert_grads_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    for k, g in got.items():
        torch.testing.assert_close(g, ref[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("stages", "replicas", "balance"), CONFIGS)
@pytest.mark.parametrize(
    ("rows", "micro_batches", "checkpoint"),
    ROW_CASES,
)
def test_loss_and_gradients_match_one_process(
    stages: int,
    replicas: int,
    balance: tuple[int, ...],
    schedule: str,
    rows: int,
    micro_batches: int,
    checkpoint: bool,
) -> None:
    groups = groups_for(stages, replicas)
    pipe = Pipeline(
        make_model(),
        balance=balance,
        micro_batches=micro_batches,
        schedule=schedule,
        stage_group=groups.stage_group,
        dp_group=groups.dp_group,
        checkpoint=checkpoint,
    )
    loss, ref_loss, ref = train_replica_slice(pipe, groups, rows, replicas)
    if pipe.is_last:
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    else:
        assert loss is None
    got = stage_grads(pipe)
    assert set(got) == expected_names(pipe)
    assert_grads_close(got, ref)


def make_nested_model(seed: int = 0) -> nn.Sequential:
    """make_model's layers, the middle two grouped in a block (a stage holding it cannot split
    its backward)."""
    flat = make_model(seed)
    return nn.Sequential(flat[0], flat[1], nn.Sequential(flat[2], flat[3]), *flat[4:])


@pytest.mark.parametrize("schedule", ["1f1b", "zb"])
@pytest.mark.parametrize(
    ("split", "nested"), [(False, False), (True, True)], ids=["split-off", "nested-fallback"]
)
def test_backward_without_the_split_matches_too(split: bool, nested: bool, schedule: str) -> None:
    stages = comm.size()
    if stages not in (2, 3):
        pytest.skip("P=2 and P=3 only")
    groups = groups_for(stages, 1)
    model = make_nested_model() if nested else make_model()
    balance = (2, len(model) - 2) if stages == 2 else (2, 2, len(model) - 4)
    pipe = Pipeline(model, balance=balance, micro_batches=4, schedule=schedule,
                    stage_group=groups.stage_group, split_backward=split)
    holds_block = any(isinstance(layer, nn.Sequential) for layer in pipe.module)
    assert holds_block is (nested and pipe.stage == 1)  # the block lands on stage 1
    assert pipe.split_backward is (split and pipe.stage > 0 and not holds_block)
    x, y = make_batch(16)
    loss = pipe.train_step(x, y, nn.functional.cross_entropy)
    ref_loss, ref = reference_grads(x, y)
    if pipe.is_last:
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    # The stage's parameters are a run of the whole model's, in order (nested or not).
    names = [k for k, _ in make_model().named_parameters()]
    start = sum(len(list(m.parameters())) for m in list(model)[: sum(pipe.balance[: pipe.stage])])
    mine = list(pipe.module.parameters())
    for p, name in zip(mine, names[start : start + len(mine)], strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("stages", "replicas", "balance"), CONFIGS)
@pytest.mark.parametrize("checkpoint", [False, True], ids=["keep", "recompute"])
def test_zero_bubble_gradients_are_bit_identical_to_1f1b(
    stages: int, replicas: int, balance: tuple[int, ...], checkpoint: bool
) -> None:
    # The W passes add each micro-batch's weight gradients in 1F1B's order (0..m-1).
    groups = groups_for(stages, replicas)
    x, y = make_batch(14, seed=5)
    got = {}
    for schedule in ("1f1b", "zb"):
        pipe = Pipeline(make_model(), balance=balance, micro_batches=4, schedule=schedule,
                        stage_group=groups.stage_group, dp_group=groups.dp_group,
                        checkpoint=checkpoint)
        loss = pipe.train_step(x, y, nn.functional.cross_entropy)
        got[schedule] = (loss, [p.grad for p in pipe.parameters()])
    assert got["zb"][0] == got["1f1b"][0]
    for a, b in zip(got["zb"][1], got["1f1b"][1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_stages_after_the_first_split_their_backward() -> None:
    if comm.size() not in (2, 3, 4):
        pytest.skip("P = 2, 3 or 4")
    groups = groups_for(comm.size(), 1)
    balance = {2: (3, 4), 3: (2, 2, 3), 4: (2, 2, 2, 1)}[comm.size()]
    pipe = Pipeline(make_model(), balance=balance, micro_batches=2,
                    stage_group=groups.stage_group)
    assert pipe.split_backward is (pipe.stage > 0)


@pytest.mark.parametrize(("stages", "replicas", "balance"), CONFIGS)
def test_replicas_weighted_by_unequal_batches(
    stages: int, replicas: int, balance: tuple[int, ...]
) -> None:
    groups = groups_for(stages, replicas)
    sizes = [5 + 3 * d for d in range(replicas)]  # replica d holds sizes[d] rows
    total = sum(sizes)
    x, y = make_batch(total, seed=3)
    d = groups.layout.replica
    lo = sum(sizes[:d])
    pipe = Pipeline(
        make_model(),
        balance=balance,
        micro_batches=4,
        stage_group=groups.stage_group,
        dp_group=groups.dp_group,
    )
    pipe.train_step(x[lo : lo + sizes[d]], y[lo : lo + sizes[d]], nn.functional.cross_entropy,
                    dp_weight=sizes[d] / total)
    _, ref = reference_grads(x, y)
    for k, g in stage_grads(pipe).items():
        torch.testing.assert_close(g, ref[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("schedule", "stages", "replicas", "balance"), SCHEDULE_CASES)
def test_inference_matches_one_process(
    schedule: str, stages: int, replicas: int, balance: tuple[int, ...]
) -> None:
    """On the rank holding the last stage (with zbv rank 0, which holds the last chunk)."""
    groups = groups_for(stages, replicas)
    pipe = Pipeline(make_model(), balance=balance, micro_batches=3, schedule=schedule,
                    stage_group=groups.stage_group)
    x, _ = make_batch(11)
    out = pipe.forward(x)
    if pipe.is_last:
        assert out is not None
        with torch.no_grad():
            torch.testing.assert_close(out, make_model()(x), rtol=1e-5, atol=1e-6)
    else:
        assert out is None


@pytest.mark.parametrize(("stages", "replicas", "balance"), CONFIGS)
def test_1f1b_and_zb_activation_memory_is_flat_in_micro_batches(
    stages: int, replicas: int, balance: tuple[int, ...]
) -> None:
    groups = groups_for(stages, replicas)
    peaks: dict[tuple[str, int], int] = {}
    for schedule in SCHEDULES:
        for m in (4, 8):
            pipe = Pipeline(make_model(), balance=balance, micro_batches=m, schedule=schedule,
                            stage_group=groups.stage_group)
            x, y = make_batch(4 * m)  # micro-batches of 4 rows whatever m
            with ActivationMeter() as meter:
                pipe.train_step(x, y, nn.functional.cross_entropy)
            assert meter.live_bytes == 0, "activations must be freed by the end of the step"
            peaks[schedule, m] = meter.peak_bytes
            held = {"1f1b": min(stages - pipe.stage, m), "gpipe": m, "zb": min(stages, m)}
            assert pipe.stats.peak_in_flight == held[schedule]
            assert held[schedule] == peak_in_flight(pipe.table, pipe.stage)
    assert peaks["1f1b", 4] == peaks["1f1b", 8]
    assert peaks["zb", 4] == peaks["zb", 8]
    assert peaks["gpipe", 8] == 2 * peaks["gpipe", 4]
    assert peaks["1f1b", 8] < peaks["gpipe", 8]
    assert peaks["zb", 8] < peaks["gpipe", 8]


@pytest.mark.parametrize(("stages", "replicas", "balance"), CONFIGS)
@pytest.mark.parametrize(
    ("rows_x", "rows_y", "match"),
    [
        pytest.param(3, 3, "at least as many rows as micro-batches", id="too-few-rows"),
        pytest.param(8, 6, "batch sizes differ", id="x-y-mismatch"),
        pytest.param(None, 8, "first stage got no inputs", id="no-inputs"),
    ],
)
def test_bad_batch_raises_on_every_rank(
    stages: int, replicas: int, balance: tuple[int, ...],
    rows_x: int | None, rows_y: int, match: str,
) -> None:
    groups = groups_for(stages, replicas)
    pipe = Pipeline(make_model(), balance=balance, micro_batches=4, stage_group=groups.stage_group)
    x = make_batch(rows_x)[0] if rows_x is not None else None
    y = make_batch(rows_y)[1]
    with pytest.raises(PipelineError, match=match):
        pipe.train_step(x, y, nn.functional.cross_entropy)
    # The pipeline still works after an error that every rank saw.
    x, y = make_batch(8)
    pipe.train_step(x, y, nn.functional.cross_entropy)


def test_balance_must_match_the_pipeline() -> None:
    with pytest.raises(PipelineError, match="one layer count per stage"):
        Pipeline(make_model(), balance=(1,) * 7, micro_batches=2, stage_group=comm.world())


@pytest.mark.parametrize(
    "stages_of", [pytest.param("world", id="P=world"), pytest.param("one", id="P=1")]
)
def test_build_pipeline_over_the_world(stages_of: str) -> None:
    stages = comm.size() if stages_of == "world" else 1
    if stages > len(make_model()):
        pytest.skip("more ranks than layers")
    pipe = build_pipeline(make_model(), stages=stages, micro_batches=2)
    assert sum(pipe.balance) == len(make_model()) and len(pipe.balance) == stages
    replicas = comm.size() // stages
    x, y = make_batch(6 * replicas)
    d = comm.rank() // stages
    pipe.train_step(x[6 * d : 6 * d + 6], y[6 * d : 6 * d + 6], nn.functional.cross_entropy)
    _, ref = reference_grads(x, y)
    for k, g in stage_grads(pipe).items():
        torch.testing.assert_close(g, ref[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(PipelineError, match="divide the world size"):
        build_pipeline(make_model(), stages=comm.size() + 1, micro_batches=2)


def test_time_balance_is_the_same_on_every_rank() -> None:
    stages = comm.size()
    if stages > len(make_model()):
        pytest.skip("more ranks than layers")
    x, y = make_batch(8)
    pipe = build_pipeline(make_model(), stages=stages, micro_batches=2, balance="time",
                          sample=(x, y), loss_fn=nn.functional.cross_entropy)  # fmt: skip
    assert len(set(comm.allgather_object(pipe.balance))) == 1  # every rank cuts alike
    assert sum(pipe.balance) == len(make_model()) and len(pipe.balance) == stages
    pipe.train_step(x, y, nn.functional.cross_entropy)
    _, ref = reference_grads(x, y)
    for k, g in stage_grads(pipe).items():
        torch.testing.assert_close(g, ref[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(PipelineError, match="pass sample"):
        build_pipeline(make_model(), stages=stages, micro_batches=2, balance="time")
    with pytest.raises(PipelineError, match="'params', 'time' or layers per stage"):
        build_pipeline(make_model(), stages=stages, micro_batches=2, balance="flops")


def test_time_balance_gives_a_slower_rank_fewer_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank measures itself and the profiles are gathered: here the last stage's ranks
    report every layer 3x slower than the others (as a rank of a third of the speed would), and
    get fewer layers than the equal ranks' cut gives them; every rank cuts alike."""
    from hethpc.pipeline import profile

    stages = 2
    if comm.size() % stages or stages > len(make_model()):
        pytest.skip("P = 2 needs an even world")
    real = profile._measure
    slow = 3.0 if comm.rank() % stages == stages - 1 else 1.0

    def measured(*args: object, **kw: object) -> profile.LayerProfile:
        p = real(*args, **kw)  # type: ignore[arg-type]
        return profile.LayerProfile(tuple(1e-3 * slow for _ in p.layer_s),
                                    tuple(1e-3 * slow for _ in p.first_stage_s), 0.0, p.trainable)

    x, y = make_batch(8)
    even = build_pipeline(make_model(), stages=stages, micro_batches=2, balance="time",
                          sample=(x, y)).balance  # fmt: skip
    monkeypatch.setattr(profile, "_measure", measured)
    skewed = build_pipeline(make_model(), stages=stages, micro_batches=2, balance="time",
                            sample=(x, y)).balance  # fmt: skip
    assert len(set(comm.allgather_object(skewed))) == 1
    layers = len(make_model())
    assert skewed[-1] < layers / 2 and skewed[-1] <= even[-1], (even, skewed)


# ZB-V: (stages, replicas, balance) with 2P chunks of the 7-layer model; chunk c runs on rank c
# for c < P, else on rank 2P-1-c (P=4 would need 8 chunks).


def chunk_grads(pipe: Pipeline) -> dict[str, torch.Tensor]:
    """The gradients of this rank's chunks under the whole model's parameter names."""
    mods = list(pipe.module) if len(pipe.chunks) > 1 else [pipe.module]
    out = {}
    for c, mod in zip(pipe.chunks, mods, strict=True):
        offset = sum(pipe.balance[:c])
        for k, p in mod.named_parameters():
            layer, name = k.split(".", 1)
            assert p.grad is not None, f"chunk {c}: no gradient for {k}"
            out[f"{int(layer) + offset}.{name}"] = p.grad
    return out


def chunk_names(pipe: Pipeline) -> set[str]:
    out = set()
    for c in pipe.chunks:
        lo, hi = sum(pipe.balance[:c]), sum(pipe.balance[: c + 1])
        out |= {k for k, _ in make_model().named_parameters() if lo <= int(k.split(".")[0]) < hi}
    return out


@pytest.mark.parametrize(("stages", "replicas", "balance"), ZBV_CONFIGS)
@pytest.mark.parametrize(
    ("rows", "micro_batches", "checkpoint"),
    [*ROW_CASES, pytest.param(24, 8, False, id="24rows-m8")],
)
def test_zbv_loss_and_gradients_match_one_process(
    stages: int, replicas: int, balance: tuple[int, ...], rows: int, micro_batches: int,
    checkpoint: bool,
) -> None:
    groups = groups_for(stages, replicas)
    pipe = Pipeline(make_model(), balance=balance, micro_batches=micro_batches, schedule="zbv",
                    stage_group=groups.stage_group, dp_group=groups.dp_group,
                    checkpoint=checkpoint)  # fmt: skip
    r = pipe.stage
    assert pipe.chunks == sorted({r, 2 * stages - 1 - r})
    assert pipe.is_first is (r == 0) and pipe.is_last is (r == 0)  # rank 0: chunks 0 and 2P-1
    loss, ref_loss, ref = train_replica_slice(pipe, groups, rows, replicas)
    if r == 0:
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    else:
        assert loss is None
    got = chunk_grads(pipe)
    assert set(got) == chunk_names(pipe)
    assert len(list(pipe.parameters())) == len(got)  # both chunks' parameters
    assert_grads_close(got, ref)


@pytest.mark.parametrize(
    ("split", "nested"), [(False, False), (True, True)], ids=["split-off", "nested-fallback"]
)
def test_zbv_without_the_split_matches_too(split: bool, nested: bool) -> None:
    stages = comm.size()
    if stages not in (2, 3):
        pytest.skip("P=2 and P=3 only")
    groups = groups_for(stages, 1)
    model = make_nested_model() if nested else make_model()  # the block: layers 2-3
    n = len(model)  # 7, or 6 with the block
    balance = (2, 1, 2, n - 5) if stages == 2 else (1, 1, 1, 1, 1, n - 5)
    pipe = Pipeline(model, balance=balance, micro_batches=4, schedule="zbv",
                    stage_group=groups.stage_group, split_backward=split)  # fmt: skip
    splits = [st.split_backward for st in pipe._stages]
    if not split:
        assert not any(splits)
    holds_block = [any(isinstance(m, nn.Sequential) for m in st.module) for st in pipe._stages]
    for c, s, block in zip(pipe.chunks, splits, holds_block, strict=True):
        assert s is (split and c > 0 and not block)
    x, y = make_batch(16)
    loss = pipe.train_step(x, y, nn.functional.cross_entropy)
    ref_loss, ref = reference_grads(x, y)
    if pipe.is_last:
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    names = [k for k, _ in make_model().named_parameters()]
    layers = list(model)
    for c, st in zip(pipe.chunks, pipe._stages, strict=True):
        start = sum(len(list(m.parameters())) for m in layers[: sum(pipe.balance[:c])])
        mine = list(st.module.parameters())
        for p, name in zip(mine, names[start : start + len(mine)], strict=True):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("stages", "replicas", "balance"), ZBV_CONFIGS)
def test_zbv_activation_memory_is_flat_in_micro_batches(
    stages: int, replicas: int, balance: tuple[int, ...]
) -> None:
    groups = groups_for(stages, replicas)
    peaks = {}
    for m in (8, 16):  # both past the warm-up's 2P - 1 forwards
        pipe = Pipeline(make_model(), balance=balance, micro_batches=m, schedule="zbv",
                        stage_group=groups.stage_group)  # fmt: skip
        x, y = make_batch(4 * m)
        with ActivationMeter() as meter:
            pipe.train_step(x, y, nn.functional.cross_entropy)
        assert meter.live_bytes == 0, "activations must be freed by the end of the step"
        peaks[m] = meter.peak_bytes
        # chunk-micro-batches: at most 2 min(P, m), 1F1B's peak in half-stage chunks
        assert pipe.stats.peak_in_flight == peak_in_flight(pipe.table, pipe.stage)
        assert pipe.stats.peak_in_flight <= 2 * min(stages, m)
    assert peaks[8] == peaks[16]


def test_zbv_needs_targets_on_rank_0_and_a_balance_per_chunk() -> None:
    stages = comm.size()
    if stages not in (2, 3):
        pytest.skip("P=2 and P=3 only")
    groups = groups_for(stages, 1)
    with pytest.raises(PipelineError, match=f"give {2 * stages} layer counts, one per chunk"):
        Pipeline(make_model(), balance=(2,) * (stages - 1) + (7 - 2 * (stages - 1),),
                 micro_batches=4, schedule="zbv", stage_group=groups.stage_group)
    balance = (2, 2, 2, 1) if stages == 2 else (1, 1, 2, 1, 1, 1)
    pipe = Pipeline(make_model(), balance=balance, micro_batches=4, schedule="zbv",
                    stage_group=groups.stage_group)  # fmt: skip
    x, y = make_batch(8)
    # y where the 1F1B's last stage would need it, not on rank 0: every rank raises
    with pytest.raises(PipelineError, match=r"last stage \(0\) \(it holds the last chunk\)"):
        pipe.train_step(x, y if pipe.stage == stages - 1 else None, nn.functional.cross_entropy)
    pipe.train_step(x if pipe.stage == 0 else None, y if pipe.stage == 0 else None,
                    nn.functional.cross_entropy)  # only rank 0 needs the batch
    with pytest.raises(PipelineError, match=r"in 1\.\.4096"):
        Pipeline(make_model(), balance=balance, micro_batches=4097, schedule="zbv",
                 stage_group=groups.stage_group)


def test_zbv_state_dict_round_trips_both_chunks() -> None:
    stages = comm.size()
    if stages not in (1, 2, 3):
        pytest.skip("P = 1, 2 or 3")
    groups = groups_for(stages, 1)
    balance = {1: (3, 4), 2: (2, 2, 2, 1), 3: (1, 1, 2, 1, 1, 1)}[stages]
    pipe = Pipeline(make_model(), balance=balance, micro_batches=2, schedule="zbv",
                    stage_group=groups.stage_group)  # fmt: skip
    state = pipe.state_dict()
    other = Pipeline(make_model(seed=7), balance=balance, micro_batches=2, schedule="zbv",
                     stage_group=groups.stage_group)  # fmt: skip
    holding = {str(k) for k, mod in enumerate(pipe.module) if list(mod.parameters())}
    assert {k.split(".")[0] for k in state} == holding  # the rank's two chunks (with weights)
    assert len(state) == sum(1 for _ in pipe.parameters())
    other.load_state_dict(state)
    for a, b in zip(pipe.parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("balance", ["params", "time"])
def test_build_pipeline_cuts_zbv_into_two_chunks_per_stage(balance: str) -> None:
    stages = comm.size()
    if 2 * stages > len(make_model()):
        pytest.skip("more chunks than layers")
    x, y = make_batch(8)
    pipe = build_pipeline(make_model(), stages=stages, micro_batches=2, schedule="zbv",
                          balance=balance, sample=(x, y), loss_fn=nn.functional.cross_entropy)
    assert len(pipe.balance) == 2 * stages and sum(pipe.balance) == len(make_model())
    assert len(set(comm.allgather_object(pipe.balance))) == 1
    pipe.train_step(x, y, nn.functional.cross_entropy)
    _, ref = reference_grads(x, y)
    for k, g in chunk_grads(pipe).items():
        torch.testing.assert_close(g, ref[k], rtol=1e-5, atol=1e-6)
