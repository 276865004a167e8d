"""The text workload's data: ``convert.py text`` (windows, by-file split, sites), the site
partition, and their refusals."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import pytest

from hethpc.cli import convert, inspect_dataset
from hethpc.data import PartitionError, make_partitioner, open_dataset, sources
from hethpc.data.partition.site import SitePartitioner, assign_sites
from hethpc.data.sources.text import num_windows

CONTEXT = 8
# (path under the source folder, its site, its bytes); sizes give 3..40 windows of 9 bytes.
FILES = [
    ("email/parser.py", "email", 300),
    ("email/mime/text.py", "email", 100),
    ("json/__init__.py", "json", 200),
    ("json/decoder.py", "json", 150),
    ("asyncio/tasks.py", "asyncio", 250),
    ("argparse.py", "argparse", 120),
    ("typing.py", "typing", 90),
    ("abc.py", "abc", 60),
    ("tiny.py", "tiny", 5),  # shorter than a window
]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("src")
    for i, (rel, _, n) in enumerate(FILES):
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes((i * 7 + j * 31) % 90 + 32 for j in range(n)))
    (d / "blob.py").write_bytes(b"\x00\x01binary")
    (d / "notes.txt").write_bytes(b"not python" * 20)
    for skipped in ("test/test_x.py", "site-packages/pkg/m.py", "__pycache__/m.py"):
        (d / skipped).parent.mkdir(parents=True)
        (d / skipped).write_bytes(b"x" * 100)
    return d


def _convert(src: Path, out: Path, *extra: str) -> None:
    argv = ["text", str(src), "--out", str(out), "--context", str(CONTEXT),
            "--val-fraction", "0.15", "--test-fraction", "0.15", *extra]
    assert convert.main(argv) == 0


@pytest.fixture(scope="module")
def out(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("text") / "out"
    _convert(src, o)
    return o


def test_windows_are_the_files_bytes_shifted_by_one(src: Path, out: Path) -> None:
    splits = {s: open_dataset(out / s) for s in ("train", "val", "test")}
    texts = {rel: (src / rel).read_bytes() for rel, _, _ in FILES}
    seen = 0
    for ds in splits.values():
        x, y = ds.read(np.arange(len(ds)))
        assert x.shape == (len(ds), CONTEXT + 1) and x.dtype == np.uint8
        np.testing.assert_array_equal(y, x[:, -1])
        starts = [bytes(x[i]) for i in range(len(ds))]
        windows = [t[a : a + CONTEXT + 1] for rel in ds.manifest.meta["files"]
                   for t in [texts[rel]] for a in range(0, len(t) - CONTEXT, CONTEXT)]
        assert starts == windows  # input x[:, :-1], targets x[:, 1:]: one byte on
        seen += len(ds)
    assert seen == sum(num_windows(n, context=CONTEXT, stride=CONTEXT) for _, _, n in FILES)


def test_files_are_held_out_whole_and_sites_stored(out: Path) -> None:
    splits = {s: open_dataset(out / s) for s in ("train", "val", "test")}
    files = {s: set(ds.manifest.meta["files"]) for s, ds in splits.items()}
    assert files["val"] and files["test"]
    assert not files["train"] & (files["val"] | files["test"]) and not files["val"] & files["test"]
    assert {f for fs in files.values() for f in fs} == {r for r, _, _ in FILES}
    site_of = {rel: site for rel, site, _ in FILES}
    for ds in splits.values():
        names = ds.manifest.sites
        assert names == sorted({site for _, site, _ in FILES})  # skipped files add none
        size = {rel: n for rel, _, n in FILES}
        want = [site_of[f] for f in ds.manifest.meta["files"]
                for _ in range(num_windows(size[f], context=CONTEXT, stride=CONTEXT))]
        assert [names[i] for i in ds.sites] == want


def test_conversion_is_deterministic_and_seeded(src: Path, out: Path, tmp_path: Path) -> None:
    _convert(src, tmp_path / "again")
    for s in ("train", "val", "test"):
        a, b = open_dataset(out / s), open_dataset(tmp_path / "again" / s)
        np.testing.assert_array_equal(a.read(np.arange(len(a)))[0], b.read(np.arange(len(b)))[0])
    held = [sources.holdout_files(np.arange(1, 30), fractions=(0.2, 0.2), seed=s)
            for s in range(3)]
    assert not np.array_equal(held[0], held[1]) or not np.array_equal(held[1], held[2])


def test_summary_counts_what_was_skipped(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _convert(src, tmp_path / "o")
    text = capsys.readouterr().out
    assert "read 9 files" in text and "7 sites" in text
    assert "1 file(s) shorter than a window" in text
    assert f"skipped 1 binary-looking ({src / 'blob.py'})" in text
    _convert(src, tmp_path / "t", "--tests", "--suffix", ".py", ".txt", "--seed", "1")
    names = open_dataset(tmp_path / "t" / "train").manifest.sites
    assert {"test", "notes"} <= set(names) and "site-packages" not in names


TEXT_MISTAKES = [
    ("missing-dir", ["{t}/nope"], "{t}/nope does not exist; expected a directory of text files"),
    ("no-files", ["{t}", "--suffix", ".rs"], "no text file ending in .rs under {t}"),
    ("context-0", ["{s}", "--context", "0"], "--context 0: must be >= 1"),
    ("stride-0", ["{s}", "--stride", "0"], "--stride 0: must be >= 1"),
    ("fractions", ["{s}", "--val-fraction", "0.5", "--test-fraction", "0.5"],
     "leave nothing to train on"),
    ("no-window", ["{s}", "--context", "4000"], "the train split gets no window"),
    ("no-num-classes", ["{s}", "--num-classes", "3"], "unrecognized arguments: --num-classes 3"),
]


@pytest.mark.parametrize(("name", "argv", "message"), TEXT_MISTAKES,
                         ids=[m[0] for m in TEXT_MISTAKES])
def test_text_mistakes_are_one_line(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, argv: list[str],
    message: str,
) -> None:
    (tmp_path / "empty").mkdir()
    t = tmp_path / "empty"
    refused = pytest.raises(SystemExit) if name == "no-num-classes" else contextlib.nullcontext()
    with refused:
        code = convert.main(["text", *(a.format(t=t, s=src) for a in argv),
                             "--out", str(tmp_path / "o")])
        assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(t=t) in err, err
    assert not (tmp_path / "o").exists()


SIZES = np.array([50, 10, 40, 10, 30, 5, 5, 0])


def test_site_partition_gives_whole_balanced_sites() -> None:
    held = assign_sites(SIZES, 3, seed=0)
    assert sorted(np.concatenate(held).tolist()) == [0, 1, 2, 3, 4, 5, 6]  # the empty one: none
    loads = sorted(int(SIZES[h].sum()) for h in held)
    assert loads == [50, 50, 50]
    sites = np.repeat(np.arange(len(SIZES)), SIZES)
    part = make_partitioner("site", sites=sites)
    parts = part.all_indices(np.zeros(len(sites)), 3, seed=4)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(sites)))
    for p in parts:  # every site on one rank only
        for s in np.unique(sites[p]):
            assert set(np.flatnonzero(sites == s)) <= set(p.tolist())
    again = SitePartitioner(sites=sites).all_indices(np.zeros(len(sites)), 3, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    ties = {tuple(map(tuple, assign_sites(np.ones(6, np.int64), 2, seed=s))) for s in range(6)}
    assert len(ties) > 1  # the seed orders sites of equal size


SITE_MISTAKES = [
    ("no-site-column", None, 2,
     "partition 'site' needs every sample's site, and this data has no site column"),
    ("fewer-sites-than-ranks", np.array([0, 0, 1, 1, 1]), 3,
     "the data has 2 sites for 3 ranks; use at most 2 ranks"),
]


@pytest.mark.parametrize(("name", "sites", "n", "message"), SITE_MISTAKES,
                         ids=[m[0] for m in SITE_MISTAKES])
def test_site_partition_refusals(
    name: str, sites: np.ndarray | None, n: int, message: str
) -> None:
    with pytest.raises(PartitionError, match=re.escape(message)):
        SitePartitioner(sites=sites).all_indices(np.zeros(5), n, seed=0)


def test_inspect_shows_sites_and_ranks(
    out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "s.png"
    argv = [str(out / "train"), "--partition", "site", "--world-size", "2", "--plot", str(png)]
    assert inspect_dataset.main(argv) == 0
    text = capsys.readouterr().out
    assert "samples per site and rank (site, 2 ranks, seed 0)" in text
    assert "rank 0:" in text and "rank 1:" in text and png.is_file()
    mnist = tmp_path / "m"
    assert convert.main(["synthetic", "--samples", "40", "--split", "train",
                         "--out", str(mnist)]) == 0
    assert inspect_dataset.main([str(mnist / "train"), "--partition", "site"]) == 2
    assert "has no site column" in capsys.readouterr().err
