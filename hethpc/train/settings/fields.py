"""The settings of a training run: one frozen dataclass of about sixty fields, each with its
default, its help text (also the CLI's) and whether it is node-local or may change on resume.

What the settings mean together (the rules that refuse a combination, the autos they resolve)
reads this class only (:mod:`~hethpc.train.settings.rules`,
:mod:`~hethpc.train.settings.policy`); :class:`~hethpc.train.settings.config.TrainConfig` is
these fields checked by those rules at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hethpc.comm.runtime import TRANSPORTS
from hethpc.sync import POLICIES


def _f(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    local: bool = False,
    operational: bool = False,
) -> Any:
    # local: may legitimately differ between ranks (paths on node-local disks, display).
    # operational: does not change what is trained, so --resume lets it differ.
    meta = {"help": help, "choices": choices, "local": local, "operational": local or operational}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """Every setting of a training run, unchecked; each field is one ``--flag`` of
    ``jobs/train.py``. Build a :class:`~hethpc.train.settings.config.TrainConfig`, which checks
    them."""

    # Data
    data: str = _f(
        "mnist1d",
        "'mnist1d' (generated and cached on first use) or a converted dataset: the directory "
        "holding train/ and test/ (and val/, scored during training when present), or its "
        "train/",
    )
    samples: int = _f(20_000, "MNIST-1D samples to generate (80% train, 20% test)")
    val_fraction: float = _f(
        0.0,
        "hold out this fraction of the training samples (drawn by --data-seed, before any "
        "partition) as a validation split: the evaluations during training score it (val_acc) "
        "and the test split is scored at the end only; 0: none. Refused with --data that holds "
        "a val/ split of its own, which is scored instead",
    )
    data_seed: int = _f(42, "seed of the generated MNIST-1D data and of --val-fraction's split")
    cache_dir: str = _f(
        "",
        "where generated data sets are cached; empty: $HETHPC_CACHE when set, else ~/.cache/hethpc",
        local=True,
    )
    partition: str = _f(
        "iid",
        "how samples map to ranks; site: whole sites per rank (a text window's package), "
        "balanced by size, from --seed; needs data with a site column (hethpc-convert text)",
        choices=("iid", "seldp", "labels", "dirichlet", "site"),
    )
    labels_per_rank: int = _f(
        2,
        "labels each rank holds with --partition labels (ranks x labels must cover every "
        "class, unless --allow-uncovered)",
    )
    allow_uncovered: bool = _f(
        False, "--partition labels may leave classes on no rank (they are never trained on)"
    )
    dirichlet_alpha: float = _f(0.5, "concentration with --partition dirichlet (small = skewed)")
    inject_alpha: float = _f(0.0, "data injection: fraction of ranks that send samples each step")
    inject_beta: float = _f(0.0, "data injection: fraction of a sender's batch that is sent")
    rebalance: str = _f(
        "auto",
        "unequal batches on partitioned data: each rank reads its partition's share of the "
        "global batch and the slow ranks send what they do not compute on to the fast ones, so "
        "every step draws from each partition as uniform batches do (a few samples per step). "
        "auto: on with --batching dynamic or static, --partition labels, dirichlet or site, "
        "and gradients averaged every step (sync bsp, or selsync with aggregation grads)",
        choices=("auto", "on", "off"),
    )
    # Model and optimisation
    model: str = _f(
        "cnn1d",
        "a built-in model (mlp, cnn1d, cnn1d_wide, resnet, large) or your own: "
        "'package.module:factory' or 'path/to/file.py:factory', called as "
        "factory(sample_shape, num_classes)",
    )
    loss: str = _f(
        "cross_entropy",
        "cross_entropy, mse, l1, smooth_l1, or your own 'package.module:factory' (called "
        "without arguments, returns loss(output, target))",
    )
    epochs: int = _f(5, "passes over the training set")
    max_steps: int = _f(0, "stop after this many steps in total (0: run every epoch)")
    batch_size: int = _f(128, "global batch: the sum of every rank's batch, kept fixed")
    optimizer: str = _f(
        "sgd",
        "optimizer: adamw is Adam with decoupled weight decay (docs/training-job.md)",
        choices=("sgd", "adam", "adamw"),
    )
    lr: float = _f(0.05, "learning rate")
    momentum: float = _f(0.9, "SGD momentum")
    weight_decay: float = _f(
        0.0,
        "weight decay: L2 (added to the gradient, on every parameter) for sgd and adam, "
        "decoupled for adamw (the weights shrink by lr x weight_decay each step; biases and "
        "norm parameters not, unless --decay-norms-biases)",
    )
    decay_norms_biases: bool = _f(
        False,
        "adamw: decay the parameters of fewer than 2 dimensions too (biases, norm layers' "
        "scales and shifts); off: they are not decayed",
    )
    lr_schedule: str = _f(
        "constant",
        "learning-rate schedule over all steps: constant, cosine, step (x0.1 at each third), "
        "or wsd (constant, then down in a straight line to 0 over the last 20 % of the steps)",
        choices=("constant", "cosine", "step", "wsd"),
    )
    warmup_steps: int = _f(
        0,
        "learning-rate warmup: the first N steps rise in a straight line to --lr (step s at "
        "lr x (s + 1) / N), then --lr-schedule runs over the steps that remain; 0: none",
    )
    clip_grad_norm: float = _f(
        0.0,
        "clip each step's gradient to this global L2 norm: under BSP (and selsync with "
        "--aggregation grads on its syncs) the averaged gradient of the whole batch, after the "
        "allreduce, alike on every rank; on a local step (selsync, fedavg, local, ssp) this "
        "rank's own gradient; 0: no clipping (docs/training-job.md)",
    )
    accumulate: int = _f(
        1,
        "gradient accumulation: compute each rank's share of a step's batch in N micro-"
        "batches of nearly equal size, their gradients summed by size into that of the whole "
        "share (the same step, up to float rounding, in less memory; BatchNorm sees each "
        "micro-batch alone); 1: one pass",
        operational=True,
    )
    max_rank_batch: str = _f(
        "none",
        "the most samples a rank computes in one forward and backward pass (its memory's "
        "limit): none; N for every rank; N1,N2,... one per rank; or auto (measured on each "
        "rank at start: the bytes a pass keeps for backward per sample, against half the "
        "memory left: a GPU's free memory shared among its ranks, on a CPU the cgroup's limit "
        "or --memory-limit-gb). "
        "A rank whose share of the global batch exceeds its cap computes it in micro-batches "
        "of at most the cap, gradients summed as with --accumulate; the shares still follow "
        "speed (docs/training-job.md). With pipeline stages only auto, with pipeline_balance "
        "time: the cut keeps each stage's parameters, optimizer state and in-flight "
        "activations within 80 % of its rank's memory (docs/pipeline.md)",
        operational=True,
    )
    memory_limit_gb: float = _f(
        0.0,
        "with max_rank_batch auto on a CPU: the memory this rank may use, GB (0: the cgroup's "
        "limit, an error when there is none); a pipeline's cut keeps each stage within it",
        operational=True,
        local=True,
    )
    seed: int = _f(0, "seed of model initialisation, shuffling and per-rank random streams")
    # Synchronisation
    sync: str = _f("bsp", "synchronisation policy", choices=tuple(POLICIES))
    threshold: float = _f(0.3, "SelSync: relative gradient-norm change that triggers a sync")
    sync_window: int = _f(25, "SelSync: EWMA window of the gradient norm")
    max_local_steps: int = _f(
        -1,
        "SelSync: synchronise anyway after this many local steps in a row, a staleness bound. "
        "-1 (auto): 3 with --partition labels, dirichlet or site (non-IID replicas drift apart "
        "between syncs), no bound with iid or seldp; 0: no bound (the published rule, the "
        "gradient votes alone decide)",
    )
    aggregation: str = _f(
        "params", "SelSync: average parameters or gradients", choices=("params", "grads")
    )
    overlap: bool = _f(
        False,
        "BSP: allreduce the gradients in 25 MB buckets while the backward pass runs (as "
        "Horovod and DDP do; the overlap needs cores to spare); off: one allreduce after it "
        "(docs/training-job.md)",
    )
    fedavg_period: int = _f(10, "FedAvg: steps between parameter averages")
    inner_steps: str = _f(
        "fixed",
        "fedavg/local with unequal batches: 'speed' splits each rank's batch into as many "
        "local steps as it takes samples per step over the smallest batch's rank, each step "
        "of about that smallest batch, so faster ranks take more local steps between averages "
        "(DiLoCo with local steps sized by measured speed); 'fixed': one step per batch",
        choices=("fixed", "speed"),
    )
    staleness: int = _f(
        2, "SSP: steps a rank may run ahead of the slowest (0: every rank waits, as BSP)"
    )
    outer_optimizer: str = _f(
        "none",
        "outer step after every parameter average (fedavg, selsync, local): nesterov is DiLoCo "
        "(with --sync fedavg), sgd without look-ahead; none: plain averaging",
        choices=("none", "sgd", "nesterov"),
    )
    outer_lr: float = _f(0.7, "outer optimizer: learning rate on the averaged pseudo-gradient")
    outer_momentum: float = _f(
        0.5,
        "outer optimizer: momentum (DiLoCo's 0.9 is for rounds of ~500 steps; 0 with sgd and "
        "lr 1: plain averaging)",
    )
    drift_correction: str = _f(
        "auto",
        "policies that average parameters (selsync, fedavg, local): each replica adds, per "
        "local step, how much less than the average it moved in the last round, so label-"
        "skewed replicas stop drifting apart (SCAFFOLD's correction in parameter space; no "
        "extra communication). auto: on with --partition labels, dirichlet or site",
        choices=("auto", "on", "off"),
    )
    average_optimizer_state: str = _f(
        "auto",
        "policies that average parameters (selsync, fedavg): average the optimizer's state "
        "(SGD's momentum, Adam's moments) with them, so label-skewed replicas stop carrying "
        "momentum toward their own labels past an average (twice the bytes of a parameter "
        "average with SGD momentum; sent while the next step computes). auto: on with "
        "--partition labels, dirichlet or site, unless --inner-steps speed",
        choices=("auto", "on", "off"),
    )
    drift_smoothing: float = _f(
        1.0, "drift correction: weight of the newest round in the average of rounds (0, 1]"
    )
    compression: str = _f(
        "none",
        "what the sync policy sends, compressed: none, fp16 or bf16 (16-bit floats: half the "
        "bytes of every gradient, parameter and optimizer-state average; gradients weighted by "
        "b_k / B before compressing, parameters sent as their change since the last average), "
        "int8 (every policy but bsp and ssp: a byte per value of a per-chunk scale the ranks "
        "share, with error feedback; a quarter of the bytes of parameter averages and "
        "pseudo-gradients; optimizer states travel as bf16), "
        "or powersgd[:RANK] (sync bsp, with or without overlap: rank-RANK factors of each "
        "matrix-shaped gradient with error feedback, rank 4 if not given, after 10 plain steps; "
        "with overlap one round per bucket). Worth it where the link, not compute, bounds a "
        "step (docs/sync.md#compression)",
    )
    transport: str = _f(
        "auto",
        "what carries the tensor collectives: mpi (mpi4py alone, Horovod not started: an "
        "allreduce costs what MPI takes instead of waiting for Horovod's background cycle), "
        "horovod (fused allreduces in its background thread; NCCL on GPUs), or "
        "auto: horovod when a rank sees a GPU and Horovod is installed, else mpi "
        "(docs/launching.md)",
        choices=TRANSPORTS,
        operational=True,
    )
    # Batching
    batching: str = _f(
        "uniform", "how the global batch is split", choices=("uniform", "static", "dynamic")
    )
    weights: str = _f(
        "",
        "per-rank batch weights, one per data-parallel rank, e.g. '1,2': fixed with batching "
        "static, the first split with dynamic",
    )
    batch_interval: int = _f(10, "dynamic batching: steps between re-allocations")
    b_min: int = _f(
        0,
        "dynamic batching: smallest batch of a rank; 0 (auto): a quarter of its uniform share "
        "on non-IID partitions (--partition labels, dirichlet or site), where a smaller batch "
        "takes the weight from its labels, and an eighth otherwise (batch_size / replicas / 4 "
        "or / 8, at least 1), below which its step is mostly fixed cost",
    )
    slowdown: str = _f("", "emulated slow ranks, 'rank:factor@step,...' e.g. '1:2@0'")
    link: str = _f(
        "",
        "emulated link for every collective, e.g. '1gbit', '10gbit:20us' (an emulation: each "
        "transfer lasts at least as long as on that link; off by default)",
    )
    slowdown_mode: str = _f(
        "sleep",
        "how an emulated slow rank spends its extra time: asleep (sleep: frees its core) or "
        "computing (busy: as a slower node would; with more ranks than cores it takes time "
        "from the others)",
        choices=("sleep", "busy"),
    )
    device: str = _f(
        "auto",
        "where each rank computes: auto (GPU <local rank mod GPUs> when the rank sees a GPU, "
        "else the CPU), cuda (an error when no GPU is visible) or cpu",
        choices=("auto", "cuda", "cpu"),
        local=True,
    )
    # Pipeline
    pipeline_stages: int = _f(1, "pipeline stages P (world = P x data-parallel replicas)")
    micro_batches: int = _f(4, "micro-batches per batch with pipeline stages")
    pipeline_balance: str = _f(
        "params",
        "how the model is cut into pipeline stages: params (by parameter count) or time (each "
        "layer timed at start on every rank, on one micro-batch of the training data, and "
        "each stage given what its own ranks' speed allows: a slower rank holds fewer layers); "
        "a resumed run keeps its cut unless the speeds measured then call for one at least "
        "1.1x faster, and moves the stages' state to it (docs/pipeline.md); or the layers per "
        "chunk, N1,N2,... in chunk order (P numbers, 2P with schedule zbv), adding up to the "
        "model's layers",
    )
    schedule: str = _f(
        "1f1b",
        "pipeline schedule: 1f1b, gpipe, zb (ZB-H1: 1F1B with split backwards filling the "
        "bubble) or zbv (ZB-V: the model in 2P chunks, two per stage in a V; the loss is on "
        "stage 0) (docs/pipeline.md)",
        choices=("1f1b", "gpipe", "zb", "zbv"),
    )
    # Reliability and output
    eval_every: int = _f(
        1, "epochs between test evaluations on rank 0 (0: only at the end)", operational=True
    )
    eval_every_steps: int = _f(
        0,
        "steps between evaluations, instead of --eval-every epochs (0: by epochs); each "
        "evaluation's record has the run's time and its time without evaluations",
        operational=True,
    )
    run_dir: str = _f(
        "",
        "run directory: metrics, checkpoints, summary (default: a new runs/run-<N>); hethpc "
        "writes only into a new, empty or earlier hethpc run directory",
        operational=True,
    )
    checkpoint_every: int = _f(
        0, "steps between checkpoints (0: only at the end)", operational=True
    )
    keep_checkpoints: int = _f(
        3, "checkpoints kept on disk (older ones are deleted)", operational=True
    )
    resume: bool = _f(
        False, "continue from the newest valid checkpoint in the run directory", operational=True
    )
    resume_changes: str = _f(
        "",
        "with --resume: settings that may differ from the checkpoint's, comma-separated, e.g. "
        "'lr,epochs' (every other setting that changes the result must match)",
        operational=True,
    )
    on_nonfinite: str = _f(
        "skip",
        "a NaN/Inf loss or gradient on any rank: skip the step everywhere, or stop",
        choices=("skip", "stop"),
        operational=True,
    )
    max_skipped_steps: int = _f(
        10,
        "with --on-nonfinite skip: steps skipped in a row before the job stops",
        operational=True,
    )
    watchdog_s: float = _f(
        30.0,
        "end the job when no rank made progress for this long (seconds; the limit grows to "
        "20x the slowest step seen, up to --watchdog-max-s; 0: never)",
        operational=True,
    )
    watchdog_max_s: float = _f(
        1800.0, "the watchdog's limit never grows past this (seconds)", operational=True
    )
    progress: bool = _f(
        True,
        "rank 0 shows progress: a bar on a terminal, else (a SLURM log, a pipe) a plain line "
        "every --progress-every-s seconds",
        local=True,
    )
    progress_every_s: float = _f(
        30.0, "seconds between plain progress lines when the output is not a terminal", local=True
    )
    csv: bool = _f(
        False,
        "also write rank 0's metrics to <run-dir>/csv/metrics.csv (one row per step or epoch "
        "record, as Lightning's CSVLogger)",
        operational=True,
    )
    tensorboard: bool = _f(
        False,
        "also write TensorBoard event files to <run-dir>/tensorboard (torch.utils.tensorboard; "
        "view with: tensorboard --logdir <run-dir>/tensorboard)",
        operational=True,
    )

    def resume_change_set(self) -> tuple[str, ...]:
        """The settings ``resume_changes`` allows to differ (dashes read as underscores)."""
        items = (n.strip().replace("-", "_") for n in self.resume_changes.split(","))
        return tuple(n for n in items if n)
