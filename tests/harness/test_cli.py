"""The CLI end to end against the scripted SSE server: bad input and faults each give one clear line,
the right exit code, and rows that `--resume` completes without duplicates or gaps."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from lumobench.cli import app
from lumobench.metrics import spec_counters
from lumobench.results import ArmInfo, RequestRow, RunDir, RunMeta

from .helpers import DEMO, REPO, free_port, lumobench, scripted_server, small_corpus


def _run_dir(out: Path) -> Path:
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return path


def _keys(run_dir: Path) -> Counter[tuple[int, str]]:
    return Counter(r.key for r in RunDir(run_dir).read_rows())


def _one_clear_line(proc: subprocess.CompletedProcess[str], text: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert text in proc.stderr


def test_corpus_commands(tmp_path: Path) -> None:
    ok = lumobench("corpus", "check", DEMO)
    assert ok.returncode == 0 and "22 records, all valid" in ok.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text(DEMO.read_text().splitlines()[0] + "\n{not json\n" + '{"id": "x", "messages": []}\n')
    proc = lumobench("corpus", "check", bad)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{bad}:line 2: not valid JSON" in proc.stderr and f"{bad}:line 3 (id x): messages:" in proc.stderr
    frozen = lumobench("corpus", "freeze", DEMO, "--out", tmp_path / "m.json")
    assert frozen.returncode == 0
    assert (
        json.loads((tmp_path / "m.json").read_text())["records"]
        == json.loads((REPO / "manifests" / "demo.json").read_text())["records"]
    )
    stats = lumobench("corpus", "stats", DEMO)
    assert stats.returncode == 0 and "with tools / without" in stats.stdout


def test_user_mistakes_give_one_line(tmp_path: Path) -> None:
    _one_clear_line(lumobench("replay", DEMO, "--arm", "nope"), "error: unknown arm 'nope'")
    port = free_port()
    _one_clear_line(
        lumobench("replay", DEMO, "--endpoint", f"http://127.0.0.1:{port}"),
        f"cannot reach endpoint http://127.0.0.1:{port}",
    )
    # The embedded default arms exist in the repo; an empty arms folder shows the missing-arm message.
    empty_arms = tmp_path / "no-arms"
    empty_arms.mkdir()
    _one_clear_line(
        lumobench("replay", DEMO, env={"LUMOBENCH_ARMS_DIR": str(empty_arms)}), "missing arm file(s)"
    )
    _one_clear_line(
        lumobench("replay", tmp_path / "missing.jsonl", "--arm", "vllm-cpu-tiny"), "cannot read corpus"
    )
    _one_clear_line(lumobench("report", tmp_path), "not a lumobench run directory")


def test_manifest_mismatch_is_refused_with_the_changed_records(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    corpus = small_corpus(tmp_path, 4)
    assert lumobench("corpus", "freeze", corpus, "--out", tmp_path / "m.json").returncode == 0
    lines = corpus.read_text().splitlines()
    lines[2] = lines[2].replace('"max_tokens": 16', '"max_tokens": 17')
    corpus.write_text("\n".join(lines[:3]) + "\n")
    proc = lumobench(
        "replay", corpus, "--arm", scripted_arm(), "--manifest", tmp_path / "m.json", "--out", tmp_path / "r"
    )
    _one_clear_line(proc, "changed: wal-t03; missing: wal-t04")
    assert not (tmp_path / "r").exists()


def test_port_in_use_is_refused(tmp_path: Path, scripted_arm: Callable[..., Path]) -> None:
    arm = scripted_arm()
    port = int(arm.read_text().split("port = ")[1].split("\n")[0])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        proc = lumobench("replay", small_corpus(tmp_path, 2), "--arm", arm, "--out", tmp_path / "r")
    assert proc.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert not (tmp_path / "r").exists()  # refused before any run directory was made


def test_server_dying_mid_stream_fails_one_row_and_the_run_continues(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    arm = scripted_arm(
        tokens=12,
        tokens_per_event=3,
        faults={"wal-t02": "die", "wal-t03": "split", "wal-t04": "multiline", "wal-t05": "comments"},
    )
    proc = lumobench(
        "replay", small_corpus(tmp_path, 6), "--arm", arm, "--runs", "2", "--out", tmp_path / "r"
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        "2 of 12 requests failed" in proc.stderr
        and "failed: scripted run 1 wal-t02: ClientPayloadError" in proc.stderr
    )
    assert "pooled tok/s" in proc.stdout
    rows = RunDir(_run_dir(tmp_path / "r")).read_rows()
    assert len(rows) == 12 and {r.request_id for r in rows if r.status == "failed"} == {"wal-t02"}
    for r in rows:
        if r.status == "completed":
            assert r.completion_tokens == 12 and r.output_chunks == 4 and r.chunk_tokens == [3, 6, 9, 12]
            assert r.text == "".join(f"t{i} " for i in range(100, 112))
    report = json.loads(lumobench("report", _run_dir(tmp_path / "r"), "--format", "json").stdout)
    (arm_report,) = report["arms"]
    assert set(arm_report) >= {
        "arm",
        "pooled_tokens_per_s",
        "run_rates",
        "completed",
        "failed",
        "matched",
        "accepted_per_event",
        "tokens_per_chunk",
    }
    assert (arm_report["completed"], arm_report["failed"], arm_report["matched"]) == (10, 2, 5)
    assert arm_report["accepted_per_event"] == 2.0  # the scripted server accepts 2 drafts per 3-token event
    assert arm_report["tokens_per_chunk"] == 3.0 and len(arm_report["run_rates"]) == 2


def test_server_crash_aborts_and_resume_completes_without_duplicates(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    arm = scripted_arm(tokens=8, crash_once_file=str(tmp_path / "crashed"), crash_after=5)
    proc = lumobench(
        "replay", small_corpus(tmp_path, 4), "--arm", arm, "--runs", "2", "--out", tmp_path / "r"
    )
    assert proc.returncode == 3, proc.stderr
    assert "run aborted" in proc.stderr and "lumobench replay --resume" in proc.stderr
    run_dir = _run_dir(tmp_path / "r")
    before = _keys(run_dir)
    assert sum(before.values()) == 6  # five completed, the one in flight failed; nothing after it
    resumed = lumobench("replay", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    rows = RunDir(run_dir).read_rows()
    assert Counter(r.key for r in rows) == Counter(
        {(i, f"wal-t0{j}"): 1 for i in range(2) for j in range(1, 5)}
    )
    assert all(r.status == "completed" for r in rows)
    assert (run_dir / "failed-attempts.jsonl").read_text().count("\n") == 1
    segments = json.loads((run_dir / "run.json").read_text())["segments"]
    assert [(s["run_index"], s["segment"], s["outcome"]) for s in segments] == [
        (0, 0, "finished"),
        (1, 0, "aborted"),
        (1, 1, "finished"),
    ]


def test_ctrl_c_keeps_rows_and_resume_continues(tmp_path: Path, scripted_arm: Callable[..., Path]) -> None:
    arm = scripted_arm(tokens=20, interval_ms=15)
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lumobench.cli",
            "replay",
            str(small_corpus(tmp_path, 8)),
            "--arm",
            str(arm),
            "--out",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows_file = next(out.glob("*/requests.jsonl"), None) if out.exists() else None
        if rows_file and rows_file.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted: kept" in stderr and "Traceback" not in stderr
    run_dir = _run_dir(out)
    kept = _keys(run_dir)
    assert 2 <= sum(kept.values()) < 8 and max(kept.values()) == 1
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    resumed = lumobench("replay", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert _keys(run_dir) == Counter({(0, r): 1 for r in [f"wal-t{j:02d}" for j in range(1, 9)]})


def test_generate_endpoint_replays_input_ids(tmp_path: Path) -> None:
    corpus = tmp_path / "ids.jsonl"
    records = [json.loads(x) for x in small_corpus(tmp_path, 3).read_text().splitlines()]
    corpus.write_text(
        "".join(json.dumps(r | {"input_ids": list(range(5 + i))}) + "\n" for i, r in enumerate(records))
    )
    with scripted_server(tmp_path) as url:
        proc = lumobench(
            "replay",
            corpus,
            "--endpoint",
            f"{url}/v1",
            "--api",
            "generate",
            "--label",
            "sglang-ids",
            "--out",
            tmp_path / "r",
        )
    assert proc.returncode == 0, proc.stderr
    rows = RunDir(_run_dir(tmp_path / "r")).read_rows()
    assert [r.prompt_tokens for r in rows] == [5, 6, 7]
    assert all(r.completion_tokens == 16 and r.chunk_tokens == list(range(1, 17)) for r in rows)
    assert all(r.token_ids == list(range(100, 116)) for r in rows)


def test_arms_compare_on_the_matched_set_and_an_arm_that_completes_nothing_is_left_out(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    # the case first: an engine that died on its first request answers HTTP 500 to every later one
    broken = scripted_arm("broken", faults={f"wal-t0{j}": "http500" for j in (1, 2, 3, 4)})
    fast = scripted_arm("fast", tokens=12, tokens_per_event=3, faults={"wal-t02": "http500"})
    slow = scripted_arm("slow", tokens=12, tokens_per_event=1)
    corpus = small_corpus(tmp_path, 4)
    proc = lumobench(
        "replay", corpus, *(a for arm in (broken, fast, slow) for a in ("--arm", arm)), "--concurrency", "2",
        "--out", tmp_path / "r",
    )  # fmt: skip
    assert proc.returncode == 1 and "failed: fast run 1 wal-t02: HTTP 500" in proc.stderr
    assert "broken (failed)" in proc.stdout and "vs fast" in proc.stdout  # the reference: the next arm
    assert "failed (completed nothing, left out of the matched set): broken; the other arms are compared" in (
        " ".join(proc.stdout.split())
    )
    runs = sorted(p for p in (tmp_path / "r").iterdir())
    report = json.loads(lumobench("report", *runs, "--format", "json").stdout)["arms"]
    by_arm = {a["arm"]: a for a in report}
    assert (by_arm["broken"]["status"], by_arm["broken"]["matched"], by_arm["broken"]["failed"]) == (
        "failed",
        0,
        4,
    )
    assert by_arm["fast"]["matched"] == by_arm["slow"]["matched"] == 3  # wal-t02 failed in one arm
    assert (by_arm["fast"]["completed"], by_arm["slow"]["completed"]) == (3, 4)
    assert by_arm["fast"]["tokens_per_chunk"] == 3.0 and by_arm["slow"]["tokens_per_chunk"] == 1.0
    assert by_arm["slow"]["tokens"] == 3 * 11  # Σ(n − 1) over the matched set only
    assert by_arm["slow"]["reference"] == "fast" and by_arm["slow"]["ratio_vs_first"] > 0
    csv_out = lumobench("report", *runs, "--format", "csv").stdout.splitlines()
    assert (
        csv_out[0].startswith("arm,run_dir,runs,completed,failed,matched,pooled_tokens_per_s")
        and len(csv_out) == 4
    )


@pytest.mark.parametrize("flag", ["--boot-per-run", "--one-boot"])
def test_boot_per_run_starts_a_fresh_server_for_every_repetition(
    tmp_path: Path, scripted_arm: Callable[..., Path], flag: str
) -> None:
    arm = scripted_arm(tokens=6, tokens_per_event=3)
    proc = lumobench(
        "replay", small_corpus(tmp_path, 2), "--arm", arm, "--runs", "3", flag, "--out", tmp_path / "r"
    )
    assert proc.returncode == 0, proc.stderr
    run = RunDir(_run_dir(tmp_path / "r"))
    assert run.read_meta().boot_per_run is (flag == "--boot-per-run") and run.read_meta().status == "finished"
    assert len(run.read_rows()) == 6
    # the scripted server's counters start at zero in every process: a fresh boot shows none before a run
    drafts_before = [
        spec_counters(run.metrics_path(i, 0, "before").read_text()).drafts  # type: ignore[union-attr]
        for i in range(3)
    ]
    if flag == "--boot-per-run":
        assert drafts_before == [0, 0, 0]
    else:
        assert drafts_before[0] == 0 < drafts_before[1] < drafts_before[2]
    stops = run.server_log.read_text().count("=== lumobench: arm")
    assert stops == (3 if flag == "--boot-per-run" else 1)
    report = json.loads(lumobench("report", run.path, "--format", "json").stdout)["arms"][0]
    assert report["accepted_per_event"] == 2.0 and report["completed"] == 6


def test_boot_per_run_with_an_endpoint_is_one_clear_line(tmp_path: Path) -> None:
    proc = lumobench(
        "replay", small_corpus(tmp_path, 1), "--endpoint", "http://127.0.0.1:9", "--boot-per-run"
    )
    _one_clear_line(proc, "--boot-per-run needs arms that lumobench launches")


def test_corpus_stats_count_the_text_of_content_parts(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "abcd"}, {"type": "text", "text": "efg"}]
    record = {"id": "p", "messages": [{"role": "user", "content": parts}, {"role": "user", "content": "hi"}]}
    corpus = tmp_path / "parts.jsonl"
    corpus.write_text(json.dumps(record) + "\n")
    stats = CliRunner().invoke(app, ["corpus", "stats", str(corpus)], env={"COLUMNS": "120"})
    assert stats.exit_code == 0, stats.output
    [line] = [line for line in stats.output.splitlines() if "message characters" in line]
    assert "9 / 9 / 9" in line  # 4 + 3 in parts, 2 in the string


def test_commands_that_do_not_compute_do_not_import_torch() -> None:
    argvs = [
        ["--help"],  # lists the torch sub-apps without importing them
        ["record", "--help"],
        ["agent", "--help"],
        ["evaluate", "--help"],
        ["replay", "--help"],
        ["serve", "--help"],
        ["report", "--help"],
        ["corpus", "stats", str(DEMO)],
    ]
    code = (
        "import sys\nfrom lumobench.cli import app\n"
        f"for argv in {argvs!r}:\n"
        "    try:\n        app(argv, standalone_mode=False)\n    except SystemExit:\n        pass\n"
        "heavy = sorted(m for m in ('torch', 'scipy', 'triton') if m in sys.modules)\n"
        "print('heavy:', heavy, file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "heavy: []"


def _one_line_error(result: Result, text: str, exit_code: int = 2) -> None:
    assert result.exit_code == exit_code and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and text in result.output, result.output


def test_bad_options_and_paths_are_one_clear_line_and_create_no_run_directory(
    tmp_path: Path, scripted_arm: Callable[..., Path], cli: Callable[..., Result]
) -> None:
    arm, corpus = scripted_arm(), small_corpus(tmp_path, 2)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    out = tmp_path / "r"
    bad_id = tmp_path / "bad-id.jsonl"
    bad_id.write_text(json.dumps(json.loads(corpus.read_text().splitlines()[0]) | {"id": "a\nb"}) + "\n")
    for args, text in [
        (["--out", a_file], f"--out {a_file} is not a directory"),
        (["--out", a_file / "sub"], f"cannot create the results folder {a_file / 'sub'}: Not a directory"),
        (["--out", out, "--port", "70000"], "Invalid value for '--port'"),
        (["--out", out, "--port", "-1"], "Invalid value for '--port'"),
        (
            ["--out", out, "--request-timeout", "0"],
            "--request-timeout must be a finite number of seconds above 0 (got 0)",
        ),
        (
            ["--out", out, "--request-timeout", "-5"],
            "--request-timeout must be a finite number of seconds above 0 (got -5)",
        ),
        (
            ["--out", out, "--request-deadline", "0"],
            "--request-deadline must be a finite number of seconds above 0",
        ),
        (
            ["--out", out, "--api-key-env", "UNSET_KEY"],
            "the environment variable UNSET_KEY, which is not set",
        ),
    ]:
        _one_line_error(cli("replay", corpus, "--arm", arm, *args), text)
    # an id replay cannot put into its X-Request-Id header is refused before anything starts
    _one_line_error(
        cli("replay", bad_id, "--arm", arm, "--out", out), "id: the id contains control characters"
    )
    assert not out.exists()
    _one_line_error(
        cli("corpus", "freeze", DEMO, "--out", tmp_path),
        f"cannot write manifest {tmp_path}: it is a directory",
    )
    nasty = tmp_path / "nasty.jsonl"
    surrogate = b'{"id": "s", "messages": [{"role": "user", "content": "\\ud800"}]}'
    nasty.write_bytes(b"[" * 50_000 + b"]" * 50_000 + b"\n" + surrogate + b"\n")
    _one_line_error(
        cli("corpus", "freeze", nasty, "--out", tmp_path / "m.json"),
        "line 1: not valid JSON (nested too deeply",
    )
    checked = cli("corpus", "check", nasty)
    _one_line_error(checked, f"{nasty}:line 2 (id s): messages.0.content: lone surrogate U+D800", exit_code=1)
    assert f"{nasty}:line 1: not valid JSON (nested too deeply; at most 64 levels)" in checked.output


def test_report_on_rows_that_are_not_utf8_is_one_clear_line(
    tmp_path: Path, cli: Callable[..., Result]
) -> None:
    meta = RunMeta(
        run_id="r",
        created="t",
        arm=ArmInfo(name="a"),
        endpoint="http://x",
        corpus="c",
        corpus_sha256="h",
        request_ids=["a", "b"],
        runs=1,
    )
    run = RunDir.create(tmp_path / "run", meta)
    run.unlock()
    row = RequestRow(run_index=0, seq=0, request_id="a", status="completed", t_send_ns=0, started_at="t")
    good = row.model_dump_json().encode()
    run.rows_path.write_bytes(good.replace(b'"a"', b'"\xff"') + b"\n" + good + b"\n")
    _one_line_error(cli("report", run.path), f"{run.rows_path}: line 1 is not a valid RequestRow")


def test_the_lazy_sub_apps_run_their_own_commands() -> None:
    listing = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert listing.exit_code == 0 and re.search(r"bench\s+Every benchmark", listing.output), listing.output
    bench = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "120"})
    assert bench.exit_code == 0 and "kernels" in bench.output and "engine" in bench.output, bench.output


def test_every_benchmark_is_a_bench_verb_and_its_python_m_form_the_same_command(tmp_path: Path) -> None:
    # every module of lumobench/bench that runs as a program (but the scripted server, not a benchmark)
    programs = [
        p
        for p in (REPO / "lumobench" / "bench").rglob("*.py")
        if p.name == "__main__.py" or 'if __name__ == "__main__"' in p.read_text()
    ]
    verbs = {(p.parent.name if p.stem == "__main__" else p.stem).replace("_", "-") for p in programs}
    verbs.discard("scripted-server")
    listing = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert listing.exit_code == 0
    assert {v for v in verbs if not re.search(rf"\s{v}\s", listing.output)} == set(), listing.output
    assert len(verbs) >= 11  # cycle, cycle-profile, loop, skinny-gemm, arm-memory, server-memory, ...
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text('vllm:generation_tokens_total{model_name="m"} 5\n')
    after.write_text('vllm:generation_tokens_total{model_name="m"} 12\n')
    verb = CliRunner().invoke(app, ["bench", "metrics-delta", str(before), str(after)])
    alias = subprocess.run(
        [sys.executable, "-m", "lumobench.bench.metrics_delta", before, after], capture_output=True, text=True
    )
    assert (
        verb.exit_code == alias.returncode == 0
        and verb.output == alias.stdout == "vllm:generation_tokens_total 7\n"
    )
