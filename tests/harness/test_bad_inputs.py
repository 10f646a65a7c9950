"""Harness inputs and disks that fight back (issue 29, items 8 and 11): records replay could not send as
meant, infinite clocks, names too long for a file system, a run directory that cannot be written or a
disk that fills mid-run, report outputs that cannot be written, run files no replay wrote, `--resume`
with options it would ignore, runs started in the same second, a symlink planted at the next run id
and a key in the endpoint's query string. Each is one clear line (or a kept, resumable run), never a
traceback."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import Result
from hypothesis import given, settings
from hypothesis import strategies as st

from lumobench.client import Target, build_request, request_deadline
from lumobench.corpus import MAX_TOKENS, REPLAY_FIELDS, check_corpus
from lumobench.plan import ReplayArgs, plan_replay
from lumobench.redact import Redactor
from lumobench.results import RunDir

from .helpers import REPO, lumobench, scripted_server, small_corpus

Cli = Callable[..., Result]
BASE = {"id": "r1", "messages": [{"role": "user", "content": "hi"}]}


def _issues(tmp_path: Path, record: dict[str, object]) -> list[str]:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return [str(issue) for issue in check_corpus(path)[1]]


def _one_line(done: subprocess.CompletedProcess[str] | Result, text: str, code: int = 2) -> None:
    """Exit `code`, no traceback, `text` said (the terminal wraps long lines: joined here); `done` is a
    CLI process or an in-process run (the `cli` fixture)."""
    returncode, said = (
        (done.returncode, done.stderr)
        if isinstance(done, subprocess.CompletedProcess)
        else (done.exit_code, done.output)
    )
    assert returncode == code, said
    assert "Traceback" not in said and text in said.replace("\n", ""), said


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("max_tokens", 10**400, "less than or equal to 10000000"),
        ("max_tokens", 10**12, "less than or equal to 10000000"),
        ("tool_choice", "sometimes", "tool_choice: must be"),
        ("tool_choice", {"type": "function"}, "tool_choice: must be"),
        ("tool_choice", 5, "tool_choice: must be"),
        ("extra_body", {"stream": False}, "extra_body may not set stream"),
        ("extra_body", {"messages": [], "model": "x"}, "extra_body may not set messages, model"),
        ("extra_body", {"n": 2}, "extra_body may not set n"),
    ],
)
def test_corpus_check_refuses_what_replay_could_not_send_as_written(
    tmp_path: Path, field: str, value: object, why: str
) -> None:
    issues = _issues(tmp_path, BASE | {field: value})
    assert len(issues) == 1 and why in issues[0], issues


@settings(max_examples=200, deadline=None)
@given(
    max_tokens=st.integers(min_value=-(10**500), max_value=10**500),
    extra=st.dictionaries(
        st.sampled_from(sorted(REPLAY_FIELDS)) | st.text(max_size=10), st.integers(), max_size=3
    ),
    tool_choice=st.sampled_from(["none", "auto", "required", "x", 5])
    | st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text()})}
    ),
)
def test_a_record_corpus_check_accepts_is_sent_as_written_with_a_finite_deadline(
    tmp_path_factory: pytest.TempPathFactory, max_tokens: int, extra: dict[str, int], tool_choice: object
) -> None:
    path = tmp_path_factory.mktemp("c") / "one.jsonl"
    path.write_text(
        json.dumps(BASE | {"max_tokens": max_tokens, "extra_body": extra, "tool_choice": tool_choice})
    )
    records, issues = check_corpus(path)
    if issues:
        return
    (record,) = records
    target = Target(base_url="http://h", model="served")
    _, body = build_request(record, target)
    assert (body["model"], body["stream"], body["messages"]) == ("served", True, BASE["messages"])
    assert body["max_tokens"] == max_tokens <= MAX_TOKENS and "n" not in body
    assert request_deadline(record, target) < float("inf")


@pytest.mark.parametrize("flag", ["--request-timeout", "--request-deadline"])
@pytest.mark.parametrize("value", ["inf", "nan", "0"])
def test_infinite_or_empty_clocks_are_refused(cli: Cli, tmp_path: Path, flag: str, value: str) -> None:
    proc = cli("replay", small_corpus(tmp_path, 1), "--endpoint", "http://127.0.0.1:9", flag, value)
    _one_line(proc, f"error: {flag} must be a finite number of seconds above 0")


def test_names_too_long_for_a_file_name(cli: Cli, tmp_path: Path) -> None:
    corpus = small_corpus(tmp_path, 1, max_tokens=4)
    with scripted_server(tmp_path, tokens=4) as url:
        out = tmp_path / ("o" * 300)
        _one_line(cli("replay", corpus, "--endpoint", url, "--out", out), "File name too long")
        label = "L" * 300
        proc = cli("replay", corpus, "--endpoint", url, "--label", label, "--out", tmp_path / "r")
    assert proc.exit_code == 0, proc.output
    (run,) = (tmp_path / "r").iterdir()
    assert len(run.name.encode()) <= 255 and RunDir.open(run).read_meta().arm.name == label


def _file_size_limit(limit: int) -> None:
    """Runs in the child: writes past `limit` bytes fail with EFBIG (as a full disk fails with ENOSPC)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _cli_limited(limit: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lumobench.cli", *map(str, args)],
        capture_output=True, text=True, timeout=120, cwd=REPO, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: _file_size_limit(limit),
    )  # fmt: skip


def test_a_disk_that_fills_mid_run_aborts_it_cleanly_and_resume_completes_it(tmp_path: Path) -> None:
    # a file-size limit stands for the full disk (a real tmpfs needs mount rights): requests.jsonl stops
    # growing after a few rows while run.json still fits
    corpus = small_corpus(tmp_path, 8, max_tokens=6)
    with scripted_server(tmp_path, tokens=6) as url:
        full = _cli_limited(3000, "replay", corpus, "--endpoint", url, "--out", tmp_path / "r")
        (run_dir,) = (tmp_path / "r").iterdir()
        lines = (run_dir / "requests.jsonl").read_bytes().splitlines(keepends=True)
        _one_line(full, f"cannot write {run_dir / 'requests.jsonl'}: File too large", code=3)
        assert f"lumobench replay --resume {run_dir}" in full.stderr.replace("\n", "")
        assert 0 < len(lines) < 8 and all(line.endswith(b"\n") for line in lines)  # no torn row
        assert RunDir.open(run_dir).read_meta().status == "aborted"
        # the same limit of 0 stands for a read-only run directory (root writes through permissions)
        _one_line(_cli_limited(0, "replay", "--resume", run_dir), "cannot write")
        resumed = lumobench("replay", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    rows = RunDir.open(run_dir).read_rows()
    assert sorted(r.request_id for r in rows) == sorted(
        json.loads(x)["id"] for x in corpus.read_text().splitlines()
    )


def test_a_full_28_kib_tmpfs_ends_the_run_aborted_with_whole_rows_and_read_only_resume_is_one_line(
    cli: Cli, tmp_path: Path
) -> None:
    # the issue's own disk: a real tmpfs (mounting needs CAP_SYS_ADMIN; skipped, saying so, without it)
    (disk := tmp_path / "disk").mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=28k", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        pytest.skip("mounting a tmpfs needs CAP_SYS_ADMIN here")
    try:
        corpus = small_corpus(tmp_path, 22, max_tokens=6)
        with scripted_server(tmp_path, tokens=6) as url:  # its own process: the run's files close with it
            full = lumobench("replay", corpus, "--endpoint", url, "--out", disk / "r")
        _one_line(full, "No space left on device", code=3)
        (run_dir,) = (disk / "r").iterdir()
        lines = (run_dir / "requests.jsonl").read_bytes().splitlines(keepends=True)
        assert 0 < len(lines) < 22 and all(line.endswith(b"\n") for line in lines)
        assert RunDir.open(run_dir).read_meta().status == "aborted"  # the reserve made room for it
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        _one_line(cli("replay", "--resume", run_dir), "Read-only file system")
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _finished_run(cli: Cli, tmp_path: Path) -> Path:
    corpus = small_corpus(tmp_path, 3, max_tokens=4)
    with scripted_server(tmp_path, tokens=4) as url:
        assert cli("replay", corpus, "--endpoint", url, "--out", tmp_path / "r").exit_code == 0
    (run_dir,) = (tmp_path / "r").iterdir()
    return run_dir


def test_report_outputs_that_cannot_be_written_fail_before_the_notebook_runs(
    cli: Cli, tmp_path: Path
) -> None:
    run_dir = _finished_run(cli, tmp_path)
    (tmp_path / "a-file").write_text("x")
    for flag, out, why in (
        ("--plots", tmp_path / "a-file", "is a file"),
        ("--html", tmp_path, "is a directory"),
    ):
        start = time.monotonic()
        proc = cli("report", run_dir, flag, out)
        _one_line(proc, why)
        assert "executing" not in proc.output and time.monotonic() - start < 20


def _rewrite(
    run_dir: Path, meta: dict[str, object] | None = None, rows: list[dict[str, object]] | None = None
) -> None:
    if meta is not None:
        (run_dir / "run.json").write_text(json.dumps(meta))
    if rows is not None:
        (run_dir / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_refuses_run_files_no_replay_wrote(cli: Cli, tmp_path: Path) -> None:
    run_dir = _finished_run(cli, tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    cases = [
        (meta | {"runs": 10**9}, rows, "is not valid run metadata"),
        (meta, [*rows, rows[0]], "has two completed rows"),
        (meta, [rows[0] | {"t_end_ns": rows[0]["t_first_ns"] - 1}, *rows[1:]], "its times go backwards"),
        (meta, [rows[0] | {"completion_tokens": 10**30}, *rows[1:]], "completion_tokens"),
        (meta, [rows[0] | {"completion_tokens": -3}, *rows[1:]], "completion_tokens"),
        (meta, [rows[0] | {"request_id": "nobody"}, *rows[1:]], "is not part of the run"),
    ]
    for bad_meta, bad_rows, why in cases:
        _rewrite(
            run_dir, bad_meta, [*bad_rows, rows[-1]]
        )  # a valid last line: a bad earlier one is no torn write
        start = time.monotonic()
        _one_line(cli("report", run_dir, "--format", "json"), why)
        assert time.monotonic() - start < 30, why


@pytest.mark.parametrize(
    "given",
    [["--runs", "2"], ["--concurrency", "2"], ["--max-tokens-cap", "8"], ["--endpoint", "http://127.0.0.1:9"],
     ["--arm", "lumotree"], ["--label", "x"], ["--out", "elsewhere"], ["--one-boot"]],
)  # fmt: skip
def test_resume_refuses_the_options_it_would_ignore(cli: Cli, tmp_path: Path, given: list[str]) -> None:
    (run_dir := tmp_path / "run").mkdir()
    proc = cli("replay", "--resume", run_dir, *given)
    _one_line(proc, f"--resume continues {run_dir} with its own settings; {given[0].split('=')[0]}")


def _plan(tmp_path: Path, corpus: Path, url: str) -> Path:
    (plan,) = plan_replay(ReplayArgs(corpus=corpus, endpoint=url, label="same", out=tmp_path / "r")).plans
    assert plan.meta.run_id == plan.run.path.name
    return plan.run.path


def test_runs_started_in_one_second_get_their_own_directories_and_a_planted_symlink_is_not_followed(
    tmp_path: Path,
) -> None:
    corpus = small_corpus(tmp_path, 1)
    (target := tmp_path / "elsewhere").mkdir()
    (tmp_path / "r").mkdir()
    now = datetime.now(UTC)
    for ahead in range(4):  # the next run ids, whichever second the plans land in
        stamp = now + timedelta(seconds=ahead)
        (tmp_path / "r" / f"{stamp:%Y%m%d-%H%M%S}-same").symlink_to(target, target_is_directory=True)
    with scripted_server(tmp_path, tokens=4) as url:
        paths = [_plan(tmp_path, corpus, url) for _ in range(3)]
    assert len(set(paths)) == 3 and not any(p.is_symlink() for p in paths)
    assert list(target.iterdir()) == []  # nothing written through the symlinks


def test_a_key_in_the_endpoints_query_string_is_refused_and_never_written(cli: Cli, tmp_path: Path) -> None:
    key = "sk-query-secret-1234"
    proc = cli("replay", small_corpus(tmp_path, 1), "--endpoint", f"http://127.0.0.1:9/v1?api_key={key}",
                     "--out", tmp_path / "r")  # fmt: skip
    _one_line(proc, "has a query string")
    assert key not in proc.output and not (tmp_path / "r").exists()
    assert Redactor().argv(["--endpoint", f"http://h/v1?x=1&api_key={key}"]) == [
        "--endpoint",
        "http://h/v1?x=1&api_key=***",
    ]
