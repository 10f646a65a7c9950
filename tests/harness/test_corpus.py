"""Corpus schema, loader and manifest: valid records load, every bad record is reported by line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumobench.corpus import CorpusError, check_corpus, load_corpus, record_sha256
from lumobench.manifest import (
    ManifestMismatch,
    Selection,
    diff_manifest,
    freeze_manifest,
    read_manifest,
    select_by_manifest,
    write_manifest,
)

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "corpora" / "demo.jsonl"


def _record(rid: str, **over: object) -> dict:
    rec = {
        "id": rid,
        "messages": [
            {"role": "system", "content": "agent"},
            {"role": "user", "content": "fix the bug"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        ],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
        "temperature": 0.6,
        "max_tokens": 32,
    }
    rec.update(over)
    return rec


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_demo_corpus_is_valid_and_agent_shaped() -> None:
    records = load_corpus(DEMO)
    assert len(records) >= 20
    assert len({r.id for r in records}) == len(records)
    with_tools = [r for r in records if r.tools]
    assert len(with_tools) >= 10 and len(records) - len(with_tools) >= 3
    assert any(m.tool_calls for r in records for m in r.messages)
    assert any(m.role == "tool" for r in records for m in r.messages)
    assert all(r.max_tokens is not None and 64 <= r.max_tokens <= 256 for r in records)
    lengths = sorted(len(json.dumps(r.model_dump(mode="json"))) for r in records)
    assert lengths[-1] > 5 * lengths[0]  # varied lengths


def test_every_bad_record_is_reported_with_line_and_field(tmp_path: Path) -> None:
    bad_tool = _record("r3")
    bad_tool["messages"][3].pop("tool_call_id")
    corpus = _write(
        tmp_path / "c.jsonl",
        [
            json.dumps(_record("r1")),
            '{"id": "r2", "messages": [',  # not JSON
            json.dumps(bad_tool),
            json.dumps(_record("r4", temperature=-1)),
            json.dumps(_record("r5", tempreature=0.5)),  # typo in a field name
            json.dumps(_record("r1")),  # duplicate id
            "",
            json.dumps(_record("r7", messages=[])),
        ],
    )
    records, issues = check_corpus(corpus)
    assert [r.id for r in records] == ["r1"]
    where = {(i.line, i.field) for i in issues}
    assert (2, "") in where
    assert (3, "messages.3") in where
    assert (4, "temperature") in where
    assert (5, "tempreature") in where
    assert (6, "id") in where
    assert (8, "messages") in where
    assert {i.line for i in issues} == {2, 3, 4, 5, 6, 8}
    with pytest.raises(CorpusError, match="line 2"):
        load_corpus(corpus)


def test_tool_result_must_answer_an_earlier_call(tmp_path: Path) -> None:
    rec = _record("r1")
    rec["messages"][3]["tool_call_id"] = "nope"
    _, issues = check_corpus(_write(tmp_path / "c.jsonl", [json.dumps(rec)]))
    assert len(issues) == 1 and "answers no earlier tool call" in issues[0].message


def test_record_hash_ignores_key_order_and_whitespace_but_not_content() -> None:
    from lumobench.corpus import CorpusRecord

    a = CorpusRecord.model_validate_json(json.dumps(_record("x")))
    b = CorpusRecord.model_validate_json(json.dumps(_record("x"), indent=3, sort_keys=True))
    c = CorpusRecord.model_validate_json(json.dumps(_record("x", temperature=0.7)))
    assert record_sha256(a) == record_sha256(b) != record_sha256(c)


def test_manifest_roundtrip_and_mismatch_lists_changed_records(tmp_path: Path) -> None:
    lines = [json.dumps(_record(f"r{i}")) for i in range(4)]
    corpus = _write(tmp_path / "c.jsonl", lines)
    manifest = freeze_manifest(corpus, load_corpus(corpus))
    write_manifest(manifest, tmp_path / "m.json")
    manifest = read_manifest(tmp_path / "m.json")
    assert [r.id for r in select_by_manifest(manifest, tmp_path / "m.json", load_corpus(corpus))] == [
        "r0",
        "r1",
        "r2",
        "r3",
    ]

    lines[1] = json.dumps(_record("r1", max_tokens=33))
    del lines[2]
    lines.append(json.dumps(_record("r9")))
    _write(corpus, lines)
    with pytest.raises(ManifestMismatch) as exc:
        select_by_manifest(manifest, tmp_path / "m.json", load_corpus(corpus))
    assert (
        exc.value.diff.changed == ["r1"]
        and exc.value.diff.missing == ["r2"]
        and exc.value.diff.added == ["r9"]
    )
    assert "changed: r1" in str(exc.value) and "missing: r2" in str(exc.value)


def test_a_selection_manifest_tolerates_new_unselected_records(tmp_path: Path) -> None:
    corpus = _write(tmp_path / "c.jsonl", [json.dumps(_record(f"r{i}")) for i in range(3)])
    records = load_corpus(corpus)
    manifest = freeze_manifest(corpus, [records[2], records[0]], Selection(rule="ids", params={"n": 2}))
    _write(corpus, [json.dumps(_record(f"r{i}")) for i in range(5)])
    chosen = select_by_manifest(manifest, tmp_path / "m.json", load_corpus(corpus))
    assert [r.id for r in chosen] == ["r2", "r0"]
    assert diff_manifest(manifest, load_corpus(corpus)).added == ["r1", "r3", "r4"]


def test_shipped_demo_manifest_matches_demo_corpus() -> None:
    manifest_path = REPO / "manifests" / "demo.json"
    manifest = read_manifest(manifest_path)
    assert [r.id for r in select_by_manifest(manifest, manifest_path, load_corpus(DEMO))] == [
        r.id for r in load_corpus(DEMO)
    ]


def test_greedy_demo_is_the_demo_with_all_sampling_removed() -> None:
    """corpora/demo-greedy.jsonl (for arms that serve greedy requests only, e.g. vLLM CPU MTP): the same
    requests in the same order, temperature 0 and no other sampling field; its manifest pins it."""
    greedy_path = REPO / "corpora" / "demo-greedy.jsonl"
    sampling = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty"}
    sampling |= {"repetition_penalty", "seed"}
    demo = [json.loads(line) for line in DEMO.read_text().splitlines()]
    greedy = [json.loads(line) for line in greedy_path.read_text().splitlines()]
    assert greedy == [{k: v for k, v in r.items() if k not in sampling} | {"temperature": 0.0} for r in demo]
    assert all(r.is_greedy for r in load_corpus(greedy_path))
    assert sum(r.is_greedy for r in load_corpus(DEMO)) == 3  # the demo itself samples 19 of its 22
    manifest_path = REPO / "manifests" / "demo-greedy.json"
    selected = select_by_manifest(read_manifest(manifest_path), manifest_path, load_corpus(greedy_path))
    assert [r.id for r in selected] == [r["id"] for r in demo]


def _issues_of(tmp_path: Path, raw: bytes) -> list:
    path = tmp_path / "c.jsonl"
    path.write_bytes(json.dumps(_record("ok")).encode() + b"\n" + raw + b"\n")
    records, issues = check_corpus(path)
    assert [r.id for r in records] == ["ok"]  # the good line still loads
    return issues


SET, SET_TEXT = "<set>", b'"<set>"'  # a placeholder value, then replaced by raw JSON text


def _line(**over: object) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, exactly as a JSON file can hold them
    return json.dumps(_record("bad", **over)).encode()


@pytest.mark.parametrize(
    ("raw", "field", "why"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "", "nested too deeply"),
        (_line(extra_body={"a": json.loads("[" * 70 + "]" * 70)}), "extra_body", "nested deeper than 64"),
        (b'{"id": "big", "seed": ' + b"9" * 5000 + b"}", "", "4300 digits"),
        (b'{"id": "x", "messages": [{"role": "user", "content": "\xff"}]}', "", "not valid UTF-8"),
        (_line(messages=[{"role": "user", "content": "a\ud800b"}]), "messages.0.content", "lone surrogate"),
        (_line(extra_body={"k\udc00": 1}), "extra_body", "lone surrogate"),
        (_line(id="two\nlines"), "id", "control characters"),
        (_line(id="   "), "id", "blank"),
        (_line(id=" padded"), "id", "whitespace"),
        (_line(repetition_penalty=SET).replace(SET_TEXT, b"Infinity"), "repetition_penalty", "inf"),
        (_line(temperature=SET).replace(SET_TEXT, b"NaN"), "temperature", "nan"),
        (_line(temperature=SET).replace(SET_TEXT, b"1e400"), "temperature", "inf"),
        (_line(max_tokens=True), "max_tokens", "valid integer"),
        (_line(temperature="0.5"), "temperature", "valid number"),
        (_line(repetition_penalty=3.0), "repetition_penalty", "less than or equal to 2"),
        (_line(seed=2**70), "seed", "less than or equal to"),
        (_line(input_ids=[1, -2]), "input_ids.1", "greater than or equal to 0"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_records_replay_cannot_send_are_rejected_with_line_and_field(
    tmp_path: Path, raw: bytes, field: str, why: str
) -> None:
    (issue,) = _issues_of(tmp_path, raw)
    assert (issue.line, issue.field) == (2, field)
    assert why in issue.message and "\n" not in str(issue)


def test_the_loop_benchs_corpus_is_valid_and_sends_ignore_eos_in_both_apis(tmp_path: Path) -> None:
    """`lumobench bench loop corpus` writes records replay accepts (the corpus check
    refuses sampling settings hidden in extra_body); ignore_eos reaches the generate API's
    sampling_params and the chat body."""
    from typer.testing import CliRunner

    from lumobench.cli import app
    from lumobench.client import Target, build_request

    path = tmp_path / "loop.jsonl"
    result = CliRunner().invoke(
        app, ["bench", "loop", "corpus", str(path), "--context", "16", "--tokens", "8", "--requests", "2"]
    )
    assert result.exit_code == 0, result.output
    records, issues = check_corpus(path)
    assert len(records) == 2 and issues == []
    _, generate = build_request(records[0], Target("http://x", api="generate"))
    assert generate["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
    assert generate["input_ids"] == records[0].input_ids
    _, chat = build_request(records[0], Target("http://x", model="m"))
    assert chat["ignore_eos"] is True and chat["max_tokens"] == 8
