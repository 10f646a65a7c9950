"""Run directories: rows survive crashes, resume keeps one completed row per key and retries failures."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lumobench.errors import LumobenchError
from lumobench.results import ArmInfo, RequestRow, RunDir, RunMeta, missing_keys, write_text_atomic


def _meta() -> RunMeta:
    return RunMeta(
        run_id="r",
        created="t",
        arm=ArmInfo(name="a"),
        endpoint="http://x",
        corpus="c",
        corpus_sha256="h",
        request_ids=["a", "b", "c"],
        runs=2,
    )


def _row(rid: str, run: int, status: str = "completed") -> RequestRow:
    return RequestRow(run_index=run, seq=0, request_id=rid, status=status, t_send_ns=0, started_at="t")  # type: ignore[arg-type]


def test_torn_last_line_is_ignored_and_resume_has_no_duplicates_or_gaps(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", _meta())
    for r in (_row("a", 0), _row("b", 0, "failed"), _row("a", 0), _row("c", 0)):
        run.append_row(r)
    with run.rows_path.open("a") as fh:
        fh.write('{"run_index": 1, "seq": 0, "request_')  # crash while writing
    kept = run.prepare_resume()
    assert sorted(r.key for r in kept) == [(0, "a"), (0, "c")]
    assert missing_keys(run.read_meta(), kept) == [(0, "b"), (1, "a"), (1, "b"), (1, "c")]
    assert [r.request_id for r in RunDir(run.path).read_rows()] == ["a", "c"]
    assert (run.path / "failed-attempts.jsonl").read_text().count('"b"') == 1


def test_existing_run_dir_is_not_overwritten(tmp_path: Path) -> None:
    first = RunDir.create(tmp_path / "run", _meta())
    first.append_row(_row("a", 0))
    second = RunDir.create(tmp_path / "run", (meta := _meta()))  # a run id taken: the next name
    assert (second.path.name, meta.run_id) == ("run-2", "run-2")
    assert [r.request_id for r in first.read_rows()] == ["a"] and second.read_rows() == []
    with pytest.raises(LumobenchError, match="not a lumobench run"):
        RunDir.open(tmp_path)


def test_atomic_writes_fsync_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without both fsyncs a power loss can leave run.json empty or the rename undone (ext4, xfs)."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_text_atomic(tmp_path / "run.json", "{}\n")
    assert events == ["fsync file", "replace", "fsync dir"]
    assert (tmp_path / "run.json").read_text() == "{}\n" and not list(tmp_path.glob("*.tmp"))
