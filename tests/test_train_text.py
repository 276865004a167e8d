"""Training on text windows: sequence targets, their loss and bits per byte, the val/ split,
``--partition site`` in the job, and their refusals (one process; tests/mpi/ has the ranks)."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hethpc
from hethpc import comm
from hethpc.cli import convert
from hethpc.cli.report import metric_label, time_to_baseline
from hethpc.data import ArrayDataset, DatasetError, open_dataset
from hethpc.data.adapt import from_arrays
from hethpc.data.transform import is_sequence, next_tokens, to_batch
from hethpc.models import ModelError, build_model
from hethpc.train import TrainConfig
from hethpc.train.errors import ConfigError
from hethpc.train.evaluation import (
    accuracy,
    bits_per_byte,
    default_metric,
    evaluate,
    evaluate_all,
    metric_key,
    scored,
)
from hethpc.train.losses import cross_entropy, make_loss
from hethpc.train.parts.build import check_outputs, example_inputs, input_shape, load_data
from hethpc.train.parts.capabilities import make_loader
from hethpc.train.run.loop import train
from hethpc.train.settings.policy import (
    averages_optimizer_state,
    corrects_drift,
    non_iid,
    rebalances,
    staleness_bound,
)

CONTEXT = 32
JSON_DIR = Path(sysconfig.get_paths()["stdlib"]) / "json"  # 5 files, 5 sites: every Python has it


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("text") / "json"
    argv = ["text", str(JSON_DIR), "--context", str(CONTEXT), "--out", str(out),
            "--val-fraction", "0.2", "--test-fraction", "0.2"]  # fmt: skip
    assert convert.main(argv) == 0
    return out


# --- sequence targets: plain functions ----------------------------------------------------


def test_windows_become_their_first_tokens_and_the_next_ones() -> None:
    w = np.array([[1, 2, 3, 4], [250, 0, 7, 255]], dtype=np.uint8)
    x, y = next_tokens(w)
    assert x.dtype == y.dtype == torch.int64
    assert x.tolist() == [[1, 2, 3], [250, 0, 7]]
    assert y.tolist() == [[2, 3, 4], [0, 7, 255]]
    assert x.is_contiguous() and y.is_contiguous()


@pytest.mark.parametrize(
    ("task", "sequence"),
    [(None, False), ("next-byte", True), ("classification", False)],
    ids=["no-task", "next-byte", "other-task"],
)
def test_the_task_decides_what_a_batch_is(task: str | None, sequence: bool) -> None:
    w = np.arange(12, dtype=np.uint8).reshape(3, 4)
    data = ArrayDataset(w, w[:, -1].copy(), 256, task)
    assert is_sequence(data) is sequence
    x, y = to_batch(data.x, data.y, sequence=is_sequence(data))
    if sequence:
        assert x.shape == y.shape == (3, 3) and x.dtype == torch.int64
        assert default_metric(data) is bits_per_byte
    else:  # one label per sample, uint8 scaled to [0, 1]
        assert x.dtype == torch.float32 and float(x.max()) == pytest.approx(11 / 255)
        assert y.tolist() == [3, 7, 11]
        assert default_metric(data) is accuracy


def test_sequence_cross_entropy_is_the_mean_over_every_position() -> None:
    torch.manual_seed(0)
    out, y = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    by_hand = torch.stack(
        [F.cross_entropy(out[i, t : t + 1], y[i, t : t + 1]) for i in range(2) for t in range(3)]
    ).mean()
    torch.testing.assert_close(cross_entropy(out, y), by_hand)
    torch.testing.assert_close(make_loss("cross_entropy")(out, y), by_hand)
    flat, labels = torch.randn(4, 5), torch.tensor([0, 4, 2, 2])  # one class per sample
    torch.testing.assert_close(cross_entropy(flat, labels), nn.CrossEntropyLoss()(flat, labels))


def test_bits_per_byte_and_accuracy_per_position() -> None:
    uniform = torch.zeros(2, 3, 256)  # every byte equally likely: 8 bits
    y = torch.tensor([[0, 1, 2], [3, 4, 5]])
    assert float(bits_per_byte(uniform, y)) == pytest.approx(8.0)
    sure = F.one_hot(y, 256).float() * 100  # certain and right: 0 bits
    assert float(bits_per_byte(sure, y)) == pytest.approx(0.0, abs=1e-6)
    half = sure.clone()
    half[0] = torch.zeros(3, 256)
    half[0, :, 9] = 100  # the first sample's every position wrong: argmax 9
    assert float(accuracy(half, y)) == pytest.approx(0.5)
    assert float(cross_entropy(uniform, y)) / math.log(2) == pytest.approx(8.0)
    assert metric_key(bits_per_byte) == "test_bpb"
    assert metric_label("val_bpb") == "validation bits per byte"


def test_time_to_the_baselines_bits_per_byte_reads_lower_as_better() -> None:
    def run(name: str, curve: list[tuple[float, float]]) -> dict[str, object]:
        epochs = [{"time": t, "val_bpb": v} for t, v in curve]
        return {"name": name, "epochs": epochs, "summary": {"val_bpb": curve[-1][1]}}

    fast = run("fast", [(1.0, 4.0), (2.0, 2.5), (3.0, 2.25)])
    base = run("base", [(2.0, 4.0), (4.0, 2.5), (6.0, 2.4)])
    said = time_to_baseline([fast, base])
    # target 2.45: fast crosses it a fifth of the way from 2 s to 3 s, the baseline halfway
    # from 4 s to 6 s
    assert "validation bits per byte 2.450" in said, said
    assert "fast 2.2 s (0.44x)" in said and "base 5.0 s" in said, said


# --- the converted data in the job's pieces ------------------------------------------------


def test_gpt_tiny_is_built_for_the_context_and_the_vocabulary(text: Path) -> None:
    train_set = open_dataset(text / "train")
    assert input_shape(train_set) == (CONTEXT,) and train_set.num_classes == 256
    inputs = example_inputs(train_set)
    assert inputs.dtype == torch.int64 and inputs.shape == (2, CONTEXT)
    model = build_model("gpt_tiny", input_shape(train_set), 256)
    check_outputs(model, train_set, loss="cross_entropy", what="gpt_tiny", fix="-")
    assert model(inputs).shape == (2, CONTEXT, 256)


def test_a_model_with_one_output_per_window_is_refused(text: Path) -> None:
    train_set = open_dataset(text / "train")
    model = nn.Sequential(nn.Embedding(256, 8), nn.Flatten(), nn.Linear(8 * CONTEXT, 256))
    with pytest.raises(ModelError, match=rf"token windows with {CONTEXT} next-token targets.*"
                       rf"shape \({CONTEXT}, 256\)"):  # fmt: skip
        check_outputs(model, train_set, loss="cross_entropy", what="the model", fix="fix it")


def test_evaluation_scores_bits_per_byte_of_the_next_bytes(text: Path) -> None:
    val = load_data(TrainConfig(data=str(text)))[2]
    assert val is not None and is_sequence(val)
    torch.manual_seed(0)
    model = build_model("gpt_tiny", (CONTEXT,), 256)
    score = evaluate(model, val, metric=bits_per_byte)
    assert 7.0 < score < 9.5  # an untrained model is about a uniform guess: 8 bits
    assert scored(bits_per_byte) == (bits_per_byte, accuracy)  # accuracy scored beside it
    both = evaluate_all(model, val, scored(bits_per_byte), batch=100)  # one pass, other batches
    assert both == pytest.approx([score, evaluate(model, val, metric=accuracy)], rel=1e-5)


@pytest.mark.parametrize("partition", ["labels", "dirichlet", "site"])
def test_site_partitions_are_non_iid_for_the_auto_settings(partition: str) -> None:
    cfg = TrainConfig(partition=partition, sync="selsync", batching="dynamic")
    assert non_iid(cfg) and staleness_bound(cfg) == 3 and corrects_drift(cfg)
    assert averages_optimizer_state(cfg)
    assert rebalances(TrainConfig(partition=partition, batching="dynamic"))  # BSP
    assert not non_iid(TrainConfig(partition="iid"))


def test_the_site_partition_gives_this_rank_whole_sites(text: Path) -> None:
    train_set = open_dataset(text / "train")
    loader = make_loader(TrainConfig(data=str(text), partition="site"), train_set, rank=0,
                         world_size=1)  # fmt: skip
    assert sorted(loader._base.tolist()) == list(range(len(train_set)))


# --- refusals ------------------------------------------------------------------------------


def test_site_partition_without_a_site_column_is_refused_naming_the_fix() -> None:
    data = ArrayDataset(np.zeros((20, 4), np.float32), np.arange(20) % 2, 2)
    with pytest.raises(ConfigError, match=r"partition = 'site'.*no site column.*"
                       r"hethpc-convert text DIR --out OUT"):  # fmt: skip
        make_loader(TrainConfig(partition="site"), data, rank=0, world_size=1)


def test_val_fraction_beside_a_val_split_is_refused(text: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds a validation split.*--val-fraction 0.1") as e:
        load_data(TrainConfig(data=str(text), val_fraction=0.1))
    assert e.value.key == "val_fraction"


# --- the job, end to end on one process ----------------------------------------------------


def test_gpt_tiny_trains_through_the_job_and_bits_per_byte_fall(
    text: Path, tmp_path: Path
) -> None:
    comm.init()
    torch.set_num_threads(1)
    cfg = TrainConfig(
        data=str(text), model="gpt_tiny", partition="site", optimizer="adam", lr=3e-3,
        batch_size=16, max_steps=40, eval_every_steps=5, run_dir=str(tmp_path / "run"),
        progress=False,
    )  # fmt: skip
    result = train(cfg, log=lambda _msg: None)
    s = result.summary
    records = [json.loads(line) for line in (tmp_path / "run/metrics/rank0.jsonl").open()]
    evaluations = [r for r in records if r["kind"] == "epoch"]
    scores = [r["val_bpb"] for r in evaluations]
    assert len(scores) == 8 and "test_bpb" not in records[-1]  # val/ during training
    accuracies = [r["val_acc"] for r in evaluations]  # per position, beside bits per byte
    assert all(0.0 < a < 1.0 for a in accuracies) and accuracies[-1] > accuracies[0], accuracies
    assert 0.0 < s["val_acc"] < 1.0 and 0.0 < s["test_acc"] < 1.0, s
    assert s["first_loss"] / math.log(2) > 7.0, s  # untrained: about 8 bits per byte
    assert scores[-1] < scores[0] - 0.3 and scores[-1] < 4.5, scores
    assert s["val_bpb"] == pytest.approx(scores[-1]) and s["test_bpb"] < 4.5, s
    assert s["final_loss"] < s["first_loss"] - 2.0, s
    steps = [r for r in records if r["kind"] == "step"]
    assert all(0.0 <= r["acc"] <= 1.0 for r in steps)  # accuracy per position
    assert np.mean([r["acc"] for r in steps[-10:]]) > np.mean([r["acc"] for r in steps[:2]])


def test_fit_trains_on_a_text_shard_directory(text: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("gpt_tiny", (CONTEXT,), 256)
    result = hethpc.fit(
        model, str(text / "train"), test_data=str(text / "test"), optimizer="adam", lr=3e-3,
        batch_size=16, max_steps=20, eval_every=0, run_dir=str(tmp_path / "run"),
        progress=False, log=lambda _msg: None,
    )  # fmt: skip
    s = result.summary
    assert s["test_bpb"] < 6.0, s  # bits per byte, the default metric
    assert 0.0 < s["test_acc"] < 1.0, s  # and beside it the accuracy per position
    assert s["final_loss"] < s["first_loss"] - 1.0, s


def test_fit_trains_on_in_memory_tokens_with_their_own_targets(tmp_path: Path) -> None:
    """Integer tokens x [n, T] with integer targets y [n, T]: per-position cross-entropy,
    scored in bits per token and per-position accuracy (task "tokens")."""
    g = np.random.default_rng(0)
    pattern = np.tile(np.arange(16), 64)
    starts = g.integers(0, len(pattern) - 40, 512)
    x = np.stack([pattern[i : i + 16] for i in starts])
    y = np.stack([pattern[i + 1 : i + 17] for i in starts])  # each token's next
    torch.manual_seed(0)
    result = hethpc.fit(
        build_model("gpt_tiny", (16,), 256), (x, y), test_data=(x[:64], y[:64]), batch_size=32,
        epochs=1, optimizer="adamw", lr=0.003, progress=False, run_dir=str(tmp_path / "run"),
    )  # fmt: skip
    s = result.summary
    assert s["final_loss"] < 0.5 * s["first_loss"] and s["test_bpb"] < 1.0, s
    assert s["test_acc"] > 0.9, s  # per position
    ds = from_arrays(x, y)
    assert is_sequence(ds) and ds.task == "tokens" and ds.num_classes == 16


def test_negative_tokens_and_mismatched_targets_are_refused() -> None:
    x = np.zeros((8, 4), dtype=np.int64)
    with pytest.raises(DatasetError, match="tokens and targets must be 0 or more, found -1"):
        from_arrays(x, x - 1)
    with pytest.raises(DatasetError, match=r"or integer tokens x \[n, T\] with integer"):
        from_arrays(x, np.zeros((8, 3), dtype=np.int64))
