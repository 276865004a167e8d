"""Cut an ``nn.Sequential`` into contiguous stages: by counts, parameters or per-layer costs.

Pure functions; :mod:`hethpc.pipeline.profile` measures the per-layer times."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from hethpc.pipeline.errors import BalanceError


def parse_balance(text: str) -> str | tuple[int, ...]:
    """The ``pipeline_balance`` setting: ``"params"``, ``"time"``, or the layers per chunk
    given as ``"N1,N2,..."`` (each at least 1).

    Raises:
        ValueError: anything else, naming the syntax.
    """
    t = text.strip().lower()
    if t in ("params", "time"):
        return t
    try:
        counts = tuple(int(v) for v in t.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ValueError(
            f"pipeline_balance {text!r} is not params, time or the layers per chunk, each at "
            "least 1, in chunk order (e.g. 14,12 for two stages)"
        )
    return counts


def partition_by_counts(num_layers: int, counts: Sequence[int]) -> tuple[int, ...]:
    """Validate an explicit split: ``counts[s]`` layers go to stage ``s``, in order.

    Args:
        num_layers: layers in the ``nn.Sequential``.
        counts: layers per stage; each at least 1, summing to ``num_layers``.

    Returns:
        The balance as a tuple of ints.

    Raises:
        BalanceError: a count is below 1, or the counts do not add up to ``num_layers``.
    """
    balance = tuple(int(c) for c in counts)
    if not balance:
        raise BalanceError("the balance is empty; give one layer count per stage, e.g. [2, 3]")
    if any(c < 1 for c in balance):
        raise BalanceError(
            f"every stage needs at least one layer, got balance {list(balance)}; "
            "use fewer stages or move layers to the empty ones"
        )
    if sum(balance) != num_layers:
        raise BalanceError(
            f"balance {list(balance)} covers {sum(balance)} layers but the model has "
            f"{num_layers}; the counts must add up to the number of layers"
        )
    return balance


def balance_costs(
    costs: Sequence[float],
    stages: int,
    *,
    first_costs: Sequence[float] | None = None,
    last_extra: float = 0.0,
    holds: Sequence[bool] | None = None,
) -> tuple[int, ...]:
    """Split ``costs`` into ``stages`` contiguous non-empty runs minimising the largest sum.

    Exact dynamic programme, O(n^2 * stages); among equally good splits the one with the
    earliest cut points wins, so every rank computes the same answer.

    A layer may cost less on the first stage (its input, the data, needs no gradient there)
    and the last stage may do more (the loss): ``first_costs`` and ``last_extra`` say so, and
    the split minimises the slowest stage of :func:`stage_costs`.

    Args:
        costs: one non-negative cost per layer (parameters, seconds, ...), as on any stage.
        stages: number of stages, 1 <= stages <= len(costs).
        first_costs: each layer's cost when it runs on the first stage (default ``costs``).
        last_extra: added to the last stage's cost (e.g. the loss's forward and backward).
        holds: which layers hold trainable parameters: when at least ``stages`` do, every
            stage gets one (a stage without any would have nothing to train, and a cheap
            parameter-free layer, timed amid noise, could otherwise make a stage of its own).

    Returns:
        Layers per stage.

    Raises:
        BalanceError: ``stages`` is out of range, a cost is negative, or ``first_costs``
            does not have one cost per layer.
    """
    if stages < 1:
        raise BalanceError(f"stages must be at least 1, got {stages}")
    return balance_chunks(
        [costs] * stages, first_costs=first_costs, last_extra=last_extra, holds=holds
    )


def balance_chunks(
    costs: Sequence[Sequence[float]],
    *,
    first_costs: Sequence[float] | None = None,
    last_extra: float = 0.0,
    holds: Sequence[bool] | None = None,
    memory: Sequence[Sequence[float]] | None = None,
    limits: Sequence[float | None] | None = None,
) -> tuple[int, ...]:
    """:func:`balance_costs` where each chunk has its own layer costs: ``costs[k][i]`` is what
    layer ``i`` costs if chunk ``k`` holds it (measured on the rank that runs chunk ``k``, so a
    rank twice as slow gets about half the work), and may have a memory limit.

    Args:
        costs: one cost vector per chunk, in chunk order, each with one cost per layer.
        first_costs: each layer's cost in chunk 0, whose input needs no gradient (default
            ``costs[0]``).
        last_extra: added to the last chunk's cost.
        holds: see :func:`balance_costs`.
        memory: with ``limits``: ``memory[k][i]`` bytes layer ``i`` needs if chunk ``k``
            holds it; a chunk's layers together stay within ``limits[k]`` (None: no limit).

    Raises:
        BalanceError: no chunk, more chunks than layers, vectors of different lengths, a
            negative cost, or no cut keeps every chunk within its memory limit (the message
            says what is short).
    """
    stages = len(costs)
    if stages < 1:
        raise BalanceError("stages must be at least 1, got 0")
    n = len(costs[0])
    if any(len(c) != n for c in costs):
        raise BalanceError(
            f"every chunk needs one cost per layer ({n}), got {[len(c) for c in costs]}"
        )
    if stages > n:
        raise BalanceError(
            f"cannot cut {n} layers into {stages} stages (each stage needs a layer); "
            f"use at most {n} stages or a model with more layers"
        )
    rest0, first, extra = _checked(costs[0], first_costs, last_extra)
    prefixes = [_prefix(rest0)] + [_prefix(_checked(c, None, 0.0)[0]) for c in costs[1:]]
    prefix_first = _prefix(first)
    if holds is not None and len(holds) != n:
        raise BalanceError(f"holds must have one flag per layer ({n}), got {len(holds)}")
    held = _prefix([1.0 if h else 0.0 for h in holds]) if holds is not None else None
    if held is not None and held[-1] < stages:
        held = None  # too few layers with parameters: some stage must go without
    mem = _memory_prefixes(memory, limits, stages, n)
    lims: Sequence[float | None] = limits if limits is not None else ()
    inf = float("inf")
    # best[k][i]: smallest max-stage cost of the first i layers in k stages;
    # cut[k][i]: where stage k starts in that split.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        tail = extra if k == stages else 0.0
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                if held is not None and held[i] == held[j]:
                    continue  # layers j .. i-1 hold no parameters
                if mem is not None and not _fits(mem, lims, k - 1, j, i):
                    continue
                prefix = prefix_first if j == 0 else prefixes[k - 1]
                cost = max(best[k - 1][j], prefix[i] - prefix[j] + tail)
                if cost < best[k][i] - 1e-12 * max(1.0, abs(cost)):
                    best[k][i], cut[k][i] = cost, j
    if best[stages][n] == inf:
        assert memory is not None and limits is not None  # only a memory limit rules all out
        raise BalanceError(_no_fit(memory, limits, n))
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    return tuple(bounds[s + 1] - bounds[s] for s in range(stages))


def stage_costs(
    costs: Sequence[float],
    balance: Sequence[int],
    *,
    first_costs: Sequence[float] | None = None,
    last_extra: float = 0.0,
) -> list[float]:
    """Each stage's cost under ``balance``, counted as :func:`balance_costs` counts it.

    Raises:
        BalanceError: ``balance`` does not cover the layers, or a cost is invalid.
    """
    balance = partition_by_counts(len(costs), balance)
    rest, first, extra = _checked(costs, first_costs, last_extra)
    out, start = [], 0
    for s, count in enumerate(balance):
        c = first if s == 0 else rest
        out.append(sum(c[start : start + count]))
        start += count
    out[-1] += extra
    return out


def _checked(
    costs: Sequence[float], first_costs: Sequence[float] | None, last_extra: float
) -> tuple[list[float], list[float], float]:
    rest = [float(v) for v in costs]
    first = rest if first_costs is None else [float(v) for v in first_costs]
    if len(first) != len(rest):
        raise BalanceError(
            f"first_costs has {len(first)} entries but there are {len(rest)} layers; give one "
            "first-stage cost per layer"
        )
    if any(v < 0 for v in rest + first) or last_extra < 0:
        raise BalanceError(
            f"layer costs must be non-negative, got {rest}"
            + ("" if first_costs is None else f", first-stage {first}")
            + ("" if last_extra >= 0 else f", last_extra {last_extra}")
        )
    return rest, first, float(last_extra)


def _memory_prefixes(
    memory: Sequence[Sequence[float]] | None,
    limits: Sequence[float | None] | None,
    stages: int,
    n: int,
) -> list[list[float]] | None:
    if memory is None or limits is None:
        return None
    if len(memory) != stages or len(limits) != stages or any(len(m) != n for m in memory):
        raise BalanceError(
            f"memory needs one vector of {n} layer bytes per chunk and limits one per chunk "
            f"({stages}), got {[len(m) for m in memory]} and {len(limits)}"
        )
    if any(v < 0 for m in memory for v in m):
        raise BalanceError("layer memory must be non-negative bytes")
    return [_prefix(m) for m in memory]


def _fits(
    mem: list[list[float]], limits: Sequence[float | None], chunk: int, start: int, end: int
) -> bool:
    """Whether layers ``start .. end-1`` fit chunk ``chunk``'s memory limit."""
    limit = limits[chunk]
    return limit is None or mem[chunk][end] - mem[chunk][start] <= limit


def _no_fit(memory: Sequence[Sequence[float]], limits: Sequence[float | None], n: int) -> str:
    """Why no cut fits: the largest layer on the tightest chunk, or the whole against the
    chunks' limits together."""
    mib = 2.0**20
    limited = [k for k, lim in enumerate(limits) if lim is not None]
    for k in limited:
        big = max(range(n), key=lambda i: memory[k][i])
        if memory[k][big] > float(limits[k] or 0.0):
            return (
                f"no pipeline cut fits the ranks' memory: layer {big} alone needs "
                f"{memory[k][big] / mib:.1f} MiB on chunk {k}, whose ranks have "
                f"{float(limits[k] or 0.0) / mib:.1f} MiB for it; {_MEMORY_FIX}"
            )
    need = min(sum(m) for m in memory) / mib
    have = sum(float(limits[k] or 0.0) for k in limited) / mib
    return (
        f"no pipeline cut fits the ranks' memory: the layers need about {need:.1f} MiB "
        f"in all and the limited chunks {limited} have {have:.1f} MiB for them; {_MEMORY_FIX}"
    )


_MEMORY_FIX = (
    "give more micro-batches (smaller ones hold fewer activations), more memory "
    "(memory_limit_gb), or more stages"
)


def _prefix(costs: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in costs:
        out.append(out[-1] + v)
    return out


def partition_by_params(model: nn.Sequential, stages: int) -> tuple[int, ...]:
    """Balance stages by parameter count (a proxy for memory and, often, for time).

    Raises:
        BalanceError: ``stages`` is out of range for the model's layers.
    """
    costs = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in model]
    return balance_costs(costs, stages, holds=[c > 0 for c in costs])


def split_model(model: nn.Sequential, balance: Sequence[int]) -> list[nn.Sequential]:
    """The stages of ``model`` as ``nn.Sequential`` objects sharing its layers.

    Raises:
        BalanceError: ``balance`` does not cover the model's layers exactly.
    """
    balance = partition_by_counts(len(model), balance)
    layers = list(model)
    out, start = [], 0
    for count in balance:
        out.append(nn.Sequential(*layers[start : start + count]))
        start += count
    return out


def chunk_costs(
    costs: Sequence[Sequence[float]],
    balance: Sequence[int],
    *,
    first_costs: Sequence[float] | None = None,
    last_extra: float = 0.0,
) -> list[float]:
    """Each chunk's cost under ``balance``, counted as :func:`balance_chunks` counts it
    (``costs[k]`` is what each layer costs on chunk ``k``'s ranks).

    Raises:
        BalanceError: ``balance`` does not cover the layers, or has another number of chunks
            than ``costs``.
    """
    balance = partition_by_counts(len(costs[0]) if costs else 0, balance)
    if len(balance) != len(costs):
        raise BalanceError(
            f"balance {list(balance)} has {len(balance)} chunks but there are {len(costs)} "
            "cost vectors; give one per chunk"
        )
    out, start = [], 0
    for k, count in enumerate(balance):
        c = costs[k] if k or first_costs is None else first_costs
        out.append(float(sum(c[start : start + count])))
        start += count
    out[-1] += float(last_extra)
    return out


def stage_module(
    model: nn.Sequential, balance: Sequence[int], placement: Sequence[int], stage: int
) -> nn.Module:
    """The layers stage ``stage`` holds, sharing ``model``'s, keyed as the pipeline keys its
    stage (:attr:`~hethpc.pipeline.pipe.Pipe.module`): its chunk's ``nn.Sequential``, or, when
    ``placement`` puts two chunks on the stage (a V), an ``nn.ModuleList`` of them in chunk
    order.

    Raises:
        BalanceError: ``balance`` does not cover the model's layers, or ``placement`` does not
            name a stage for each chunk, or none for ``stage``.
    """
    parts = split_model(model, balance)
    if len(placement) != len(parts):
        raise BalanceError(
            f"placement {list(placement)} names {len(placement)} chunks but balance "
            f"{list(balance)} cuts {len(parts)}; give one stage per chunk"
        )
    mine = [parts[c] for c, s in enumerate(placement) if s == stage]
    if not mine:
        raise BalanceError(f"placement {list(placement)} gives stage {stage} no chunk")
    return mine[0] if len(mine) == 1 else nn.ModuleList(mine)
