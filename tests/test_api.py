"""The public API in one process: fit() on the user's data, models and losses by import path."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hethpc
from hethpc.cli import train as train_job
from hethpc.data import ArrayDataset, DatasetError, as_dataset
from hethpc.models import ImportSpecError, ModelError, build_model
from hethpc.train import TrainConfig
from hethpc.train.evaluation import evaluate
from hethpc.train.losses import make_loss
from hethpc.train.parts.build import build


def _blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(0, 0.3, (n, 4)).astype(np.float32) + np.eye(4, dtype=np.float32)[y]
    return x, y


def test_fit_trains_a_users_classifier_on_a_torch_dataset(tmp_path: Path) -> None:
    x, y = _blobs(600)
    data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    result = hethpc.fit(model, data, test_data=_blobs(200, seed=1), batch_size=32, epochs=3,
                        run_dir=str(tmp_path / "run"), progress=False)  # fmt: skip
    assert result.summary["test_acc"] > 0.9, result.summary
    assert (tmp_path / "run" / "summary.json").exists()


def test_fit_trains_a_regression_with_the_users_loss_and_metric(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.05 * rng.normal(size=500)).astype(
        np.float32
    )

    def mae(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out.reshape(target.shape) - target).abs().mean()

    result = hethpc.fit(nn.Linear(3, 1), (x[:400], y[:400]), test_data=(x[400:], y[400:]),
                        loss=make_loss("mse"), metric=mae, batch_size=20, epochs=5, lr=0.05,
                        run_dir=str(tmp_path / "run"), progress=False)  # fmt: skip
    assert result.summary["test_mae"] < 0.15, result.summary


def test_the_users_loss_and_metric_see_outputs_in_the_targets_shape(tmp_path: Path) -> None:
    # The README's snippet: a one-output model, targets [n], nn.HuberLoss. Without reshaping,
    # [n, 1] against [n] broadcasts to [n, n] and the model learns the targets' mean only.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    seen = []

    def mae(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.append(out.shape == target.shape)
        return (out - target).abs().mean()

    torch.manual_seed(0)
    result = hethpc.fit(nn.Linear(3, 1), (x[:300], y[:300]), test_data=(x[300:], y[300:]),
                        loss=nn.HuberLoss(), metric=mae, batch_size=20, epochs=5, lr=0.05,
                        run_dir=str(tmp_path / "run"), progress=False)  # fmt: skip
    assert seen and all(seen)
    assert result.summary["test_mae"] < 0.2, result.summary


@pytest.mark.parametrize(
    ("model", "y", "match"),
    [
        (nn.Linear(4, 2), np.arange(60) % 3, r"shape \(2,\) per sample.*up to 2 \(3 classes\)"),
        (nn.Linear(4, 3), np.arange(60) % 3 + 5, r"up to 7 \(8 classes\).*shape \(8,\)"),
        (nn.Linear(4, 3), (np.arange(60) % 3).astype(np.float32), r"regression targets, one "
         r"value per sample.*y.astype\(int\)"),
    ],
    ids=["too-few-outputs", "labels-out-of-range", "float-labels"],
)
def test_a_model_whose_outputs_do_not_fit_the_labels_is_named(
    tmp_path: Path, model: nn.Module, y: np.ndarray, match: str
) -> None:
    x = np.zeros((60, 4), np.float32)
    with pytest.raises(ModelError, match=match):
        hethpc.fit(model, (x, y), batch_size=10, epochs=1, run_dir=str(tmp_path / "run"),
                   progress=False)  # fmt: skip


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ((np.zeros((3, 2)), np.zeros(4)), r"x has shape \(3, 2\) and y \(4,\)"),
        ((np.zeros((3, 2)), np.array([0, -1, 2])), "class labels must be 0 or more"),
        ((np.full((3, 2), np.nan), np.zeros(3, np.int64)), "x holds NaN"),
        ([1, 2, 3], "item 0 is a int, expected an \\(x, y\\) pair"),
        (42, "got a int; expected"),
        ((np.zeros((3, 2)), np.zeros((3, 2), np.int64)), r"integer y of shape \(3, 2\) are"),
        ((np.zeros((3, 2)), np.zeros(3), np.zeros(3)), r"is a tuple of 3: give \(x, y\)"),
    ],
    ids=["lengths", "negative-label", "nan", "not-pairs", "no-form", "label-matrix", "triple"],
)
def test_data_of_the_wrong_form_is_named(data: object, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        as_dataset(data, name="train_data")


def test_fit_refuses_unknown_and_invalid_settings(tmp_path: Path) -> None:
    with pytest.raises(hethpc.ConfigError, match="unknown setting.*did you mean 'batch_size'"):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), batch_szie=8)
    with pytest.raises(hethpc.ConfigError, match="did you mean 'test_data'"):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), testdata=_blobs(10))
    with pytest.raises(hethpc.ConfigError, match=r"\['data'\]: jobs/train.py's .* train_data"):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), data="data/mine")  # was silently ignored
    with pytest.raises(hethpc.ConfigError, match=r"lr = nan.*fit\(lr=...\)"):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), lr=float("nan"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": lambda t: t}, r"fit\(model=...\) must be a torch nn.Module, got a function"),
        ({"metric": "acc"}, r"fit\(metric=...\) must be callable .* got a str \('acc'\)"),
        ({"loss": 0.5}, r"fit\(loss=...\) must be callable"),
        ({"loss": "hinge"}, r"fit\(loss=...\): unknown loss 'hinge'"),
    ],
    ids=["model-not-module", "metric-str", "loss-float", "loss-unknown-name"],
)
def test_fit_names_a_model_loss_or_metric_of_the_wrong_kind(kwargs: dict, match: str) -> None:
    args = {"model": nn.Linear(4, 3), **kwargs}
    with pytest.raises(hethpc.ConfigError, match=match):
        hethpc.fit(args.pop("model"), _blobs(50), **args)


def test_fit_takes_a_loss_by_name_as_the_cli_does(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(200, 3)).astype(np.float32)
    y = x.sum(1).astype(np.float32)
    torch.manual_seed(0)
    result = hethpc.fit(nn.Linear(3, 1), (x, y), test_data=(x, y), loss="l1", batch_size=20,
                        epochs=10, lr=0.05, run_dir=str(tmp_path / "run"), progress=False)
    assert result.summary["test_mse"] < 0.05, result.summary  # predicting the mean: about 3


@pytest.mark.parametrize(
    ("test", "match"),
    [
        ((np.zeros((10, 5), np.float32), np.zeros(10, np.int64)),
         r"test_data: samples of shape \(5,\), but train_data's are \(4,\)"),
        ((np.zeros((10, 4), np.float32), np.zeros(10, np.float32)),
         "test_data: y are floating-point targets, but train_data's are integer class labels"),
        ((np.zeros((6, 4), np.float32), np.array([0, 1, 2, 5, 5, 7])),
         r"test_data: labels 5 \(2 samples\), 7 \(1 sample\) lie outside train_data's labels "
         r"0..2 \(3 classes\), so the model is never trained on them"),
    ],
    ids=["features", "targets-not-labels", "labels-beyond-training"],
)  # fmt: skip
def test_test_data_that_does_not_match_the_training_data_is_named_before_training(
    tmp_path: Path, test: tuple, match: str
) -> None:
    with pytest.raises(DatasetError, match=match):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), test_data=test, batch_size=10,
                   run_dir=str(tmp_path / "run"), progress=False)  # fmt: skip
    assert not (tmp_path / "run" / "metrics").exists()  # refused before the first step


def test_rerunning_fit_into_its_run_dir_names_fits_own_keywords(tmp_path: Path) -> None:
    args = {"batch_size": 10, "epochs": 1, "run_dir": str(tmp_path / "run"), "progress": False}
    hethpc.fit(nn.Linear(4, 3), _blobs(50), **args)
    with pytest.raises(hethpc.ConfigError, match=r"resume=True.*overwrite=True"):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), **args)
    assert hethpc.fit(nn.Linear(4, 3), _blobs(50), overwrite=True, **args).summary["steps"] == 5
    with pytest.raises(hethpc.ConfigError, match=r"resume=True needs run_dir"):
        hethpc.fit(nn.Linear(4, 3), _blobs(50), resume=True)


def test_a_column_of_labels_is_one_label_per_sample() -> None:
    data = as_dataset((np.zeros((4, 2), np.float32), np.array([[0], [2], [1], [2]])))
    assert data.y.tolist() == [0, 2, 1, 2] and data.num_classes == 3


def test_resuming_a_finished_fit_returns_its_final_checkpoint(tmp_path: Path) -> None:
    args = {"batch_size": 10, "epochs": 1, "run_dir": str(tmp_path / "run"), "progress": False}
    done = hethpc.fit(nn.Linear(4, 3), _blobs(50), **args).checkpoint
    again = hethpc.fit(nn.Linear(4, 3), _blobs(50), resume=True, **args)
    assert done is not None and again.checkpoint == done and again.summary["steps"] == 5


def test_fit_uses_the_loss_named_in_its_config(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    y = np.zeros(40, np.float32)
    cfg = hethpc.TrainConfig(loss="l1", batch_size=40, epochs=1, lr=1e-9, progress=False,
                             run_dir=str(tmp_path / "run"))  # fmt: skip
    model = nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.fill_(2.0)  # every output 2 against targets 0: l1 = 2, mse = 4
    assert hethpc.fit(model, (x, y), config=cfg).summary["first_loss"] == pytest.approx(2.0)


def test_resuming_fit_with_another_model_names_the_layers(tmp_path: Path) -> None:
    args = {"batch_size": 10, "run_dir": str(tmp_path / "run"), "progress": False}
    hethpc.fit(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)), _blobs(50), epochs=1, **args)
    with pytest.raises(hethpc.ConfigError, match=r"model layout: 0.bias \(8,\) -> \(16,\)"):
        hethpc.fit(nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 3)), _blobs(50), epochs=2,
                   resume=True, resume_changes="epochs", **args)  # fmt: skip


def test_uint8_samples_are_scaled_alike_in_evaluation() -> None:
    x, y = _blobs(100)
    raw = np.clip(x * 60 + 100, 0, 255).astype(np.uint8)
    model = nn.Sequential(nn.Linear(4, 3))
    as_uint8 = evaluate(model, ArrayDataset(raw, y, 3))
    as_float = evaluate(model, ArrayDataset(raw.astype(np.float32) / 255, y, 3))
    assert as_uint8 == as_float


def _factory_file(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "mymodels.py"
    p.write_text("from torch import nn\n" + body)
    return p


def test_a_model_factory_from_a_file_gets_shape_and_classes(tmp_path: Path) -> None:
    p = _factory_file(
        tmp_path, "def make(shape, classes):\n    return nn.Linear(shape[0], classes)\n"
    )
    model = build_model(f"{p}:make", (7,), 4)
    assert isinstance(model, nn.Linear) and (model.in_features, model.out_features) == (7, 4)


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("nosuchmodel", ImportSpecError, "unknown model 'nosuchmodel'"),
        ("no_such_package.mod:make", ImportSpecError, "cannot import no_such_package.mod"),
        ("/nonexistent/m.py:make", ImportSpecError, "there is no file /nonexistent/m.py"),
        ("FILE:nothere", ImportSpecError, "has no attribute 'nothere'"),
        ("FILE:wrong_args", ModelError, r"must accept \(input_shape, num_classes\)"),
        ("FILE:not_a_model", ModelError, "returned a int, not an nn.Module"),
    ],
    ids=["unknown-name", "no-module", "no-file", "no-attribute", "bad-signature", "not-module"],
)
def test_model_specs_that_do_not_load_are_named(
    tmp_path: Path, spec: str, error: type[Exception], match: str
) -> None:
    p = _factory_file(
        tmp_path, "def wrong_args():\n    pass\ndef not_a_model(s, c):\n    return 3\n"
    )
    with pytest.raises(error, match=match):
        build_model(spec.replace("FILE", str(p)), (4,), 3)


def test_a_factory_that_raises_is_named_with_its_call_and_the_exception(tmp_path: Path) -> None:
    p = _factory_file(tmp_path, "def make(shape, classes):\n    raise KeyError('depth')\n")
    with pytest.raises(ModelError, match=re.escape(
        f"model factory '{p}:make' failed, called as make((1, 12, 12), 4): KeyError: 'depth'"
    )):  # fmt: skip
        build_model(f"{p}:make", (1, 12, 12), 4)


def test_a_model_that_fails_on_the_sample_shape_is_named_before_training(
    tmp_path: Path,
) -> None:
    p = _factory_file(tmp_path, "def make(shape, classes):\n    return nn.Linear(40, classes)\n")
    cfg = TrainConfig(model=f"{p}:make")
    data = ArrayDataset(np.zeros((8, 1, 12, 12), np.float32), np.arange(8) % 4, 4)
    with pytest.raises(ModelError, match=re.escape(
        f"--model {p}:make: the model built as make((1, 12, 12), 4) fails on a batch of shape "
        "(2, 1, 12, 12): RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    )) as e:  # fmt: skip
        build(cfg, data)
    assert str(e.value).endswith("size its first layer by input_shape (1, 12, 12)")
    with pytest.raises(ModelError, match=re.escape(
        "the model fails on a batch of the training samples, shape (2, 1, 12, 12): RuntimeError"
    )):  # fmt: skip
        hethpc.fit(nn.Linear(40, 4), (data.x, data.y), epochs=1, batch_size=4, progress=False,
                   run_dir=str(tmp_path / "run"))  # fmt: skip


def test_losses_by_name_and_by_import_path() -> None:
    out, y = torch.zeros(4, 1), torch.ones(4)
    assert float(make_loss("mse")(out, y)) == 1.0  # [4, 1] against [4]: no broadcasting
    assert float(make_loss("torch.nn:HuberLoss")(out, y)) == 0.5  # the user's: reshaped too
    with pytest.raises(ImportSpecError, match="unknown loss 'hinge'"):
        make_loss("hinge")
    with pytest.raises(ImportSpecError, match="is called without arguments.*missing a required"):
        make_loss("torch.nn.functional:mse_loss")  # the loss itself, not its factory


def test_the_cli_takes_a_model_by_file_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _factory_file(
        tmp_path, "def make(shape, classes):\n    return nn.Sequential(nn.Flatten(), "
        "nn.Linear(shape[-1], classes))\n",
    )  # fmt: skip
    argv = ["--samples", "600", "--batch-size", "50", "--max-steps", "5", "--progress", "false",
            "--cache-dir", str(tmp_path / "cache"), "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert train_job.main([*argv, "--model", f"{p}:make"]) == 0
    with pytest.raises(SystemExit) as e:
        train_job.main([*argv[:-1], str(tmp_path / "run2"), "--model", f"{p}:missing"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "has no attribute 'missing'" in err and "Traceback" not in err


def test_the_cli_names_a_factory_that_ignores_num_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _factory_file(
        tmp_path, "def make(shape, classes):\n    return nn.Sequential(nn.Flatten(), "
        "nn.Linear(shape[-1], 3))\n",
    )  # fmt: skip
    argv = ["--samples", "600", "--batch-size", "50", "--max-steps", "5", "--progress", "false",
            "--cache-dir", str(tmp_path / "cache"), "--run-dir", str(tmp_path / "run")]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        train_job.main([*argv, "--model", f"{p}:make"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "gives outputs of shape (3,)" in err and "size its last layer by num_classes" in err
    assert "Traceback" not in err


def _coordinator(**kw: object) -> hethpc.Coordinator:
    model = nn.Linear(4, 3)
    return hethpc.Coordinator(model, torch.optim.SGD(model.parameters(), lr=0.1), **kw)


def test_coordinator_settings_name_the_coordinators_keywords() -> None:
    with pytest.raises(hethpc.ConfigError, match=r"\['batchng'\] \(did you mean 'batching'\?\)"):
        _coordinator(global_batch=16, batchng="dynamic")
    with pytest.raises(hethpc.ConfigError, match=r"set by Coordinator\(global_batch=...\)"):
        _coordinator(global_batch="16")


def test_coordinator_with_dynamic_batching_needs_start() -> None:
    coord = _coordinator(global_batch=16, batching="dynamic")
    coord.start()
    coord.step()
    with pytest.raises(hethpc.ConfigError, match=r"step 1 without coord.start\(\)"):
        coord.step()


def test_coordinator_refuses_a_horovod_distributed_optimizer() -> None:
    model = nn.Linear(4, 3)
    # hvd.DistributedOptimizer(opt) makes a subclass of opt's class defined in horovod.torch
    wrapped = type("DistributedOptimizer", (torch.optim.SGD,), {"__module__": "horovod.torch"})
    with pytest.raises(hethpc.ConfigError, match="Horovod DistributedOptimizer.*plain optimizer"):
        hethpc.Coordinator(model, wrapped(model.parameters(), lr=0.1), global_batch=16)
    assert not hethpc.comm.is_horovod_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_stray_label_that_leaves_classes_empty_is_named() -> None:
    x = np.zeros((9, 2), np.float32)
    y = np.array([0, 1, 2, 3, 0, 1, 2, 3, 7])  # 4 classes and one stray 7
    with pytest.warns(UserWarning, match=r"train_data: the labels run to 7, which makes 8 "
                      r"classes, and 3 of them \(4, 5, 6\) have no sample; labels \(samples\): "
                      r"0 \(2\), 1 \(2\), 2 \(2\), 3 \(2\), 7 \(1\)"):  # fmt: skip
        data = hethpc.data.adapt.from_arrays(x, y, name="train_data")
    assert data.num_classes == 8


@pytest.mark.parametrize("sync", ["bsp", "selsync", "ssp"])
def test_coordinator_skips_a_nonfinite_step_and_steps_the_next(sync: str) -> None:
    coord = _coordinator(global_batch=16, sync=sync)
    before = [p.detach().clone() for p in coord.model.parameters()]
    for p in coord.model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    assert coord.step(loss=torch.tensor(1.0)) is None
    assert coord.skipped == 1 and coord.steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, coord.model.parameters(), strict=True))
    for p in coord.model.parameters():
        p.grad = torch.ones_like(p)
    assert coord.step(loss=torch.tensor(float("nan"))) is None  # a bad loss skips it too
    for p in coord.model.parameters():
        p.grad = torch.ones_like(p)
    assert coord.step(loss=torch.tensor(1.0)) is not None
    assert coord.skipped == 2 and coord.steps == 3
    assert not all(torch.equal(a, b) for a, b in zip(before, coord.model.parameters(), strict=True))
