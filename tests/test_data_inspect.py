"""inspect_dataset.py: jobs/train.py's partition flags, one-line errors, and a readable plot."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hethpc.cli import convert, inspect_dataset
from hethpc.data import open_dataset

ROOT = Path(__file__).resolve().parents[1]

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 samples of 10 classes in 4 shards (labels 0..9 all present)."""
    out = tmp_path_factory.mktemp("inspect") / "s"
    assert convert.main(["synthetic", "--samples", "400", "--shard-samples", "100",
                         "--split", "train", "--out", str(out)]) == 0
    return out / "train"


def _main(argv: list[str]) -> int:
    """main(argv)'s exit code, whether it returns it or argparse exits with it."""
    try:
        return inspect_dataset.main(argv)
    except SystemExit as e:
        return int(e.code or 0)


# (id, flags after the dataset path, the per-rank header's settings, more text on stdout)
PARTITIONS = [
    ("labels-k5", ["--partition", "labels", "--labels-per-rank", "5"],
     "labels, 2 ranks, seed 0, 5 labels per rank", "rank 1"),
    ("labels-default-k-allowed", ["--partition", "labels", "--allow-uncovered"],
     "labels, 2 ranks, seed 0, 2 labels per rank",
     "samples are in no rank's share (classes [4, 5, 6, 7, 8, 9] are on no rank)"),
    ("labels-1-rank", ["--partition", "labels", "--labels-per-rank", "10", "--world-size", "1"],
     "labels, 1 rank, seed 0, 10 labels per rank", "rank 0"),
    ("dirichlet-default-alpha", ["--partition", "dirichlet", "--world-size", "4",
                                 "--min-size", "1"],
     "dirichlet, 4 ranks, seed 0, alpha 0.5, min size 1", "rank 3"),
    ("dirichlet-alpha", ["--partition", "dirichlet", "--dirichlet-alpha", "0.3", "--seed", "3"],
     "dirichlet, 2 ranks, seed 3, alpha 0.3, min size 10", "rank 1"),
    ("iid", ["--partition", "iid", "--world-size", "3"], "iid, 3 ranks, seed 0", "rank 2"),
    ("seldp", ["--partition", "seldp"], "seldp, 2 ranks, seed 0", "rank 1"),
]


@pytest.mark.parametrize(("name", "flags", "settings", "text"), PARTITIONS,
                         ids=[p[0] for p in PARTITIONS])
def test_partition_flags(
    ds: Path, capsys: pytest.CaptureFixture[str], name: str, flags: list[str], settings: str,
    text: str,
) -> None:
    assert _main([str(ds), *flags]) == 0
    out, err = capsys.readouterr()
    assert f"label histogram per rank ({settings})" in out
    assert text in out and err == ""


def test_defaults_match_train_py() -> None:
    args = inspect_dataset.parse_args(["d"])
    got = (args.partition, args.labels_per_rank, args.dirichlet_alpha, args.allow_uncovered)
    assert got == (None, 2, 0.5, False)
    assert inspect_dataset.PARTITIONS == ("iid", "seldp", "labels", "dirichlet", "site")


# (id, argv, text after "inspect_dataset.py: error: "); {d} is the dataset, {t} its parent.
MISTAKES = [
    ("uncovered", ["{d}", "--partition", "labels"],
     "labels_per_rank=2 on 2 ranks leaves classes [4, 5, 6, 7, 8, 9] on no rank"),
    ("uncovered-names-the-fix", ["{d}", "--partition", "labels"],
     "--labels-per-rank 5 or more covers all 10 classes on 2 ranks, or pass allow_uncovered=True "
     "(--allow-uncovered) to leave them out"),
    ("uncovered-3-ranks", ["{d}", "--partition", "labels", "--world-size", "3"],
     "leaves classes [6, 7, 8, 9] on no rank"),
    ("k-too-large", ["{d}", "--partition", "labels", "--labels-per-rank", "11"],
     "labels_per_rank=11 exceeds the 10 classes of the dataset; use at most 10"),
    ("dirichlet-min-size",
     ["{d}", "--partition", "dirichlet", "--world-size", "8", "--min-size", "200"],
     "gave a rank fewer than min_size=200 samples in 100 draws"),
    ("not-a-dataset", ["{t}/nope", "--partition", "labels", "--labels-per-rank", "5"],
     "{t}/nope is not a dataset directory (no manifest.json)"),
    ("splits-not-one-dataset", ["{t}"], "{t} is not one dataset: it holds train/; pass {t}/train"),
    ("old-partitioner-flag", ["{d}", "--partitioner", "label_skew"],
     "unrecognized arguments: --partitioner label_skew (--partitioner is now --partition)"),
    ("old-alpha-flag", ["{d}", "--partition", "dirichlet", "--alpha", "0.3"],
     "unrecognized arguments: --alpha 0.3 (--alpha is now --dirichlet-alpha)"),
    ("abbreviated-flag", ["{d}", "--verif"],
     "unrecognized arguments: --verif; did you mean --verify?"),
    ("partitioner-name", ["{d}", "--partition", "label_skew"],
     "argument --partition: invalid choice: 'label_skew'"),
    ("bad-int", ["{d}", "--world-size", "two"], "argument --world-size: invalid int value: 'two'"),
    ("world-size-0", ["{d}", "--partition", "iid", "--world-size", "0"],
     "--world-size 0: must be >= 1"),
    ("labels-per-rank-0", ["{d}", "--labels-per-rank", "0"], "--labels-per-rank 0: must be >= 1"),
    ("alpha-0", ["{d}", "--dirichlet-alpha", "0"], "--dirichlet-alpha 0.0: must be > 0"),
    ("min-size-negative", ["{d}", "--min-size", "-1"], "--min-size -1: must be >= 0"),
    ("plot-format", ["{d}", "--plot", "{t}/h.xyz"],
     "--plot {t}/h.xyz: matplotlib cannot write .xyz"),
    ("plot-directory", ["{d}", "--plot", "{t}/no/h.png"],
     "--plot {t}/no/h.png: no directory {t}/no"),
]


@pytest.mark.parametrize(("name", "argv", "message"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_mistakes_are_one_line_and_exit_2(
    ds: Path, capsys: pytest.CaptureFixture[str], name: str, argv: list[str], message: str
) -> None:
    t = ds.parent
    assert _main([f.format(d=ds, t=t) for f in argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("inspect_dataset.py: error: "), err
    assert message.format(t=t) in err
    assert "wrote" not in out
    assert not list(t.glob("h.*"))


def test_damaged_shard_is_one_line_and_exit_2(
    ds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = shutil.copytree(ds, tmp_path / "train")
    shard = copy / "shard-00001.h5"
    shard.write_bytes(shard.read_bytes()[:-100])
    assert _main([str(copy), "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"inspect_dataset.py: error: dataset {copy}")
    assert "shard-00001.h5" in err


def test_script_refusal_has_no_traceback(ds: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "data_tools" / "inspect_dataset.py"), str(ds),
                        "--partition", "labels"],
                       capture_output=True, text=True, timeout=120, check=False)
    lost = int((open_dataset(ds, verify=False).labels >= 4).sum())
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "inspect_dataset.py: error: labels_per_rank=2 on 2 ranks leaves classes "
        f"[4, 5, 6, 7, 8, 9] on no rank ({lost} of 400 samples would never be trained on); "
        "--labels-per-rank 5 or more covers all 10 classes on 2 ranks, or pass "
        "allow_uncovered=True (--allow-uncovered) to leave them out"
    ]


def test_plot_file(ds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "h.png"
    assert _main([str(ds), "--partition", "labels", "--labels-per-rank", "5",
                  "--plot", str(png)]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == PNG
    assert _main([str(ds), "--plot", str(tmp_path / "bare")]) == 0  # matplotlib adds .png
    assert f"wrote {tmp_path / 'bare.png'}" in capsys.readouterr().out
    assert (tmp_path / "bare.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    ("per_rank", "units"),
    [(None, ["shard"]), (np.array([[40, 0, 3], [0, 41, 7], [1, 2, 30]]), ["shard", "rank"])],
    ids=["shards-only", "shards-and-ranks"],
)
def test_figure_reads_well(ds: Path, per_rank: np.ndarray | None, units: list[str]) -> None:
    m = open_dataset(ds, verify=False).manifest
    if per_rank is not None:
        per_rank = np.pad(per_rank, ((0, 0), (0, m.num_classes - 3)))
    title = "s (train)\npartition labels, 3 ranks, seed 0, 2 labels per rank"
    fig = inspect_dataset.figure(m, per_rank, title)
    fig.canvas.draw()
    axes = fig.axes
    assert fig.get_suptitle() == title
    assert [ax.get_title() for ax in axes] == [f"Label histogram per {u}" for u in units]
    assert [ax.get_xlabel() for ax in axes] == units
    tallest = [max(s.num_samples for s in m.shards)]
    tallest += [] if per_rank is None else [int(per_rank.sum(1).max())]
    for ax, top in zip(axes, tallest, strict=True):
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            assert np.array_equal(ticks, np.round(ticks)), ticks
        assert ax.get_ylim()[1] > top, "the tallest bar reaches the frame"
    assert [ax.get_xticks().tolist() for ax in axes] == [
        list(range(4)), *([list(range(3))] if per_rank is not None else [])
    ]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [str(c) for c in range(m.num_classes)]
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in axes), "legend covers bars"


def test_figure_of_many_classes_has_a_colour_bar(tmp_path: Path) -> None:
    assert convert.main(["synthetic", "--samples", "100", "--classes", "25", "--split", "train",
                         "--out", str(tmp_path / "s")]) == 0
    m = open_dataset(tmp_path / "s" / "train", verify=False).manifest
    fig = inspect_dataset.figure(m, np.ones((3, 25), np.int64), "t")
    fig.canvas.draw()
    assert not fig.legends  # 25 legend entries would not fit
    (bar,) = [ax for ax in fig.axes if ax.get_ylabel() == "label"]
    panels = [ax for ax in fig.axes if ax is not bar]
    assert [ax.get_title() for ax in panels] == ["Label histogram per shard",
                                                 "Label histogram per rank"]
    box = bar.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in panels)
