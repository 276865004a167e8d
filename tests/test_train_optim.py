"""What transformer training needs of the trainer, in one process: AdamW without decay on biases
and norms, warmup before the schedule, gradient clipping and exact gradient accumulation."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hethpc
from hethpc.cli.train import parse_config
from hethpc.sync.averaging import optimizer_state_tensors
from hethpc.train import ConfigError, TrainConfig, lr_factor, param_groups, read_metrics
from hethpc.train.parts.data_parallel import micro_batches
from hethpc.train.parts.optim import GradientClip, make_optimizer
from hethpc.train.settings.compare import resume_differences


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))


def _blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(0, 0.3, (n, 4)).astype(np.float32) + np.eye(4, dtype=np.float32)[y]
    return x, y


# Warmup, then the schedule over the steps that remain.


@pytest.mark.parametrize(
    ("schedule", "step", "want"),
    [
        ("constant", 0, 0.25),
        ("constant", 1, 0.5),
        ("constant", 3, 1.0),
        ("constant", 50, 1.0),
        ("cosine", 3, 1.0),
        ("cosine", 4, 1.0),  # the cosine starts after the warmup
        ("cosine", 54, 0.5),  # half of the 100 steps that remain
        ("cosine", 104, 0.0),
        ("wsd", 84, 1.0),  # its decay: the last fifth of the 100 steps after the warmup
        ("wsd", 94, 0.5),
        ("step", 37, 1.0),
        ("step", 38, 0.1),
    ],
)
def test_warmup_rises_in_a_straight_line_then_the_schedule_runs_over_the_rest(
    schedule: str, step: int, want: float
) -> None:
    assert lr_factor(schedule, step, 104, warmup=4) == pytest.approx(want)


@pytest.mark.parametrize("schedule", ["constant", "cosine", "step", "wsd"])
def test_without_warmup_each_schedule_is_what_it_was(schedule: str) -> None:
    old = {
        "constant": lambda s: 1.0,
        "cosine": lambda s: 0.5 * (1 + np.cos(np.pi * s / 100)),
        "step": lambda s: 0.1 ** (3 * s // 100),
        "wsd": lambda s: 1.0 if s <= 80 else (100 - s) / 20,
    }[schedule]
    for s in range(101):
        assert lr_factor(schedule, s, 100) == pytest.approx(old(s))


def test_the_built_schedule_follows_the_global_step_and_resumes_exactly() -> None:
    cfg = TrainConfig(lr=0.1, lr_schedule="cosine", warmup_steps=5)
    opt, sched = make_optimizer(cfg, _net(), 50)
    rates = [opt.param_groups[0]["lr"]]
    for _ in range(20):
        opt.step()
        sched.step()
        rates.append(opt.param_groups[0]["lr"])
    assert rates == pytest.approx([0.1 * lr_factor("cosine", s, 50, warmup=5) for s in range(21)])
    assert rates[0] == pytest.approx(0.02) and rates[4] == pytest.approx(0.1)
    # A resumed run: a fresh scheduler given the saved state takes the next rate.
    opt2, sched2 = make_optimizer(cfg, _net(), 50)
    sched2.load_state_dict(sched.state_dict())
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1 * lr_factor("cosine", 21, 50, warmup=5))


# AdamW and its parameter groups.


def test_param_groups_keep_biases_and_norms_out_of_the_decay() -> None:
    net = _net()
    groups = param_groups(net, 0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    decayed = sorted(names[id(p)] for p in groups[0]["params"])
    kept = sorted(names[id(p)] for p in groups[1]["params"])
    assert decayed == ["0.weight", "3.weight"] and groups[0]["weight_decay"] == 0.1
    assert kept == ["0.bias", "1.bias", "1.weight", "3.bias"] and groups[1]["weight_decay"] == 0
    (one,) = param_groups(net, 0.1, decay_norms_biases=True)
    assert len(one["params"]) == 6 and one["weight_decay"] == 0.1


def test_param_groups_leave_out_frozen_parameters_and_empty_groups() -> None:
    net = nn.Linear(3, 2)
    net.bias.requires_grad_(False)
    assert [len(g["params"]) for g in param_groups(net, 0.1)] == [1]


def test_adamw_decays_weights_but_not_biases_or_norm_parameters() -> None:
    net = _net()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt, _ = make_optimizer(TrainConfig(optimizer="adamw", lr=0.1, weight_decay=0.5), net, 10)
    assert isinstance(opt, torch.optim.AdamW)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)  # no gradient step: only the decoupled decay moves them
    opt.step()
    for n, p in net.named_parameters():
        factor = 1 - 0.1 * 0.5 if n.endswith("weight") and p.ndim >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, rtol=0, atol=1e-7)


def test_adamw_decays_norms_and_biases_when_asked() -> None:
    net = _net()
    bias = net[3].bias.detach().clone()
    cfg = TrainConfig(optimizer="adamw", lr=0.1, weight_decay=0.5, decay_norms_biases=True)
    opt, _ = make_optimizer(cfg, net, 10)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(net[3].bias.detach(), bias * 0.95)


def test_adamw_state_is_averaged_as_adams_is() -> None:
    net = _net()
    opt, _ = make_optimizer(TrainConfig(optimizer="adamw", weight_decay=0.1), net, 10)
    net(torch.ones(2, 4)).sum().backward()
    opt.step()
    state = optimizer_state_tensors(opt, net.parameters())
    assert len(state) == 2 * len(list(net.parameters()))  # exp_avg and exp_avg_sq of each


# Clipping.


def test_clipping_scales_a_large_gradient_to_the_norm_and_leaves_a_small_one() -> None:
    net = nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    clip = GradientClip(opt, 0.5)
    for scale, want in ((10.0, 0.5), (0.01, None)):
        before = [p.detach().clone() for p in net.parameters()]
        grads = [torch.full_like(p, scale) for p in net.parameters()]
        for p, g in zip(net.parameters(), grads, strict=True):
            p.grad = g.clone()
        opt.step()
        moved = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, net.parameters(),
                                                                         strict=True)])  # fmt: skip
        norm = float(torch.cat([g.reshape(-1) for g in grads]).norm())
        assert float(clip.norm) == pytest.approx(norm)  # recorded before clipping
        assert float(moved.norm()) == pytest.approx(want if want is not None else norm, rel=1e-5)
    clip.remove()


# Accumulation.


@pytest.mark.parametrize(
    ("rows", "pieces", "want"),
    [
        (8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        (10, 4, [(0, 3), (3, 6), (6, 8), (8, 10)]),
        (3, 4, [(0, 1), (1, 2), (2, 3)]),
        (5, 1, [(0, 5)]),
    ],
    ids=["even", "uneven", "fewer-rows-than-pieces", "one"],
)
def test_micro_batches_cover_the_rows_in_nearly_equal_pieces(
    rows: int, pieces: int, want: list[tuple[int, int]]
) -> None:
    assert micro_batches(rows, pieces) == want


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))


def _fit_params(tmp_path: Path, name: str, **settings: object) -> list[torch.Tensor]:
    model = _model()
    result = hethpc.fit(
        model, _blobs(256), batch_size=30, max_steps=3, run_dir=str(tmp_path / name),
        progress=False, eval_every=0, **settings,
    )  # fmt: skip
    return [p.detach().clone() for p in result.model.parameters()]


@pytest.mark.parametrize(
    "settings",
    [{"optimizer": "sgd"}, {"optimizer": "adamw", "weight_decay": 0.1, "clip_grad_norm": 0.3}],
    ids=["sgd", "adamw-clipped"],
)
def test_accumulated_steps_train_the_same_parameters_as_whole_batches(
    tmp_path: Path, settings: dict[str, object]
) -> None:
    whole = _fit_params(tmp_path, "whole", **settings)
    pieces = _fit_params(tmp_path, "pieces", accumulate=4, **settings)  # 30 rows: 8, 8, 7, 7
    for a, b, start in zip(whole, pieces, _model().parameters(), strict=True):
        assert not torch.allclose(a, start.detach(), rtol=0, atol=1e-3)  # it trained
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# Settings: the rules and resuming.


@pytest.mark.parametrize(
    ("settings", "key", "match"),
    [
        ({"warmup_steps": -1}, "warmup_steps", "must not be negative"),
        ({"clip_grad_norm": -0.5}, "clip_grad_norm", "must not be negative"),
        ({"accumulate": 0}, "accumulate", r"at least 1 \(micro-batches per step"),
        ({"accumulate": 9, "batch_size": 8}, "accumulate", "use accumulate 8 or less"),
        ({"decay_norms_biases": True}, "decay_norms_biases", "use optimizer adamw"),
        (
            {"accumulate": 2, "pipeline_stages": 2},
            "accumulate",
            "use micro_batches .* instead",
        ),
        ({"clip_grad_norm": 1.0, "pipeline_stages": 2}, "clip_grad_norm", "pipeline stage"),
        ({"optimizer": "lion"}, "optimizer", "not one of"),
    ],
    ids=["warmup", "clip", "accumulate-0", "accumulate-over-batch", "decay-without-adamw",
         "accumulate-pipeline", "clip-pipeline", "unknown-optimizer"],  # fmt: skip
)
def test_bad_training_settings_are_named_with_the_fix(
    settings: dict[str, object], key: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**settings)  # type: ignore[arg-type]
    assert e.value.key == key


def test_resume_takes_a_new_accumulate_but_not_new_optimisation() -> None:
    saved = TrainConfig(optimizer="adamw", warmup_steps=10, clip_grad_norm=1.0).to_dict()
    now = TrainConfig(optimizer="adamw", warmup_steps=10, clip_grad_norm=1.0, accumulate=4)
    assert resume_differences(saved, now) == []  # the same step, in less memory
    changed = TrainConfig(optimizer="adamw", warmup_steps=20, clip_grad_norm=0.5)
    assert resume_differences(saved, changed) == [
        "warmup_steps: 10 -> 20", "clip_grad_norm: 1.0 -> 0.5"
    ]
    allowed = TrainConfig(
        optimizer="adamw", warmup_steps=20, clip_grad_norm=0.5,
        resume_changes="warmup-steps,clip_grad_norm",
    )  # fmt: skip
    assert resume_differences(saved, allowed) == []


def test_a_checkpoint_from_before_these_settings_resumes_at_their_defaults() -> None:
    saved = TrainConfig().to_dict()
    for name in ("warmup_steps", "clip_grad_norm", "accumulate", "decay_norms_biases"):
        del saved[name]
    assert resume_differences(saved, TrainConfig()) == []
    assert resume_differences(saved, TrainConfig(warmup_steps=3)) == ["warmup_steps: 0 -> 3"]


def test_a_run_with_all_four_resumes_bit_identical_from_its_checkpoint(tmp_path: Path) -> None:
    settings = dict(
        optimizer="adamw", weight_decay=0.1, lr=0.01, lr_schedule="cosine", warmup_steps=3,
        clip_grad_norm=0.5, accumulate=2, batch_size=30, max_steps=8, checkpoint_every=4,
        progress=False, eval_every=0, csv=True,
    )  # fmt: skip
    whole = hethpc.fit(_model(), _blobs(600), run_dir=str(tmp_path / "whole"), **settings)
    steps = [r for r in read_metrics(tmp_path / "whole" / "metrics" / "rank0.jsonl")
             if r["kind"] == "step"]  # fmt: skip
    assert [r["lr"] for r in steps[:3]] == pytest.approx([0.01 * 2 / 3, 0.01, 0.01])
    assert all(r["grad_norm"] > 0 for r in steps)  # the norm before clipping, recorded
    assert "grad_norm" in (tmp_path / "whole" / "csv" / "metrics.csv").read_text().split()[0]
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "whole", cut)
    late = list(cut.glob("checkpoints/ckpt-000000008*"))
    assert late
    for path in late:  # as if stopped after step 4's checkpoint
        path.unlink()
    said: list[str] = []
    resumed = hethpc.fit(_model(), _blobs(600), run_dir=str(cut), resume=True, log=said.append,
                         **settings)  # fmt: skip
    assert any("resumed from step 4" in line for line in said), said
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match=r"warmup_steps: 3 -> 4.*resume-changes"):
        hethpc.fit(_model(), _blobs(600), run_dir=str(cut), resume=True,
                   **{**settings, "warmup_steps": 4})  # fmt: skip
    # accumulate does not change what is trained: a resume may take another
    hethpc.fit(_model(), _blobs(600), run_dir=str(cut), resume=True,
               **{**settings, "accumulate": 3})  # fmt: skip


def test_the_job_and_its_toml_take_the_settings(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_text('[model]\noptimizer = "adamw"\nwarmup_steps = 10\nclip_grad_norm = 1.0\n')
    cfg, _ = parse_config(["--config", str(p), "--accumulate", "2", "--decay-norms-biases"])
    assert (cfg.optimizer, cfg.warmup_steps, cfg.clip_grad_norm) == ("adamw", 10, 1.0)
    assert cfg.accumulate == 2 and cfg.decay_norms_biases


def test_the_coordinator_clips_its_loops_steps() -> None:
    net = nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    coord = hethpc.Coordinator(net, opt, global_batch=4, clip_grad_norm=1e-3)
    before = [p.detach().clone() for p in net.parameters()]
    coord.start()
    opt.zero_grad()
    (net(torch.ones(4, 3)) * 100).sum().backward()
    coord.step()
    moved = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, net.parameters(),
                                                                     strict=True)])  # fmt: skip
    assert float(moved.norm()) == pytest.approx(1e-3, rel=1e-4)
