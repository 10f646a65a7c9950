"""Streams whose JSON has the wrong shape (`data: 5`, `"choices": "x"`, `"content": 5`, usage that is no
token count, ...): the row fails with an error naming the field, and the run goes on. Through the real
client and a scripted server (`lumobench.bench.client.scripted_server`, `events`), and property-based
on the recorders themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumobench.plan import ReplayArgs, Timeouts, plan_replay
from lumobench.replay import Member, run_group
from lumobench.stream import MAX_TOKEN_COUNT, ChatRecorder, GenerateRecorder, StreamRecorder

from .helpers import scripted_server

USAGE = '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
OK_CHUNK = '{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]}'
#: (event data, what the row's error names)
SHAPES = [
    ("5", "event 1 is a number, not a JSON object"),
    ('"x"', "event 1 is a string, not a JSON object"),
    ("[]", "event 1 is an array, not a JSON object"),
    ("null", "event 1 is null, not a JSON object"),
    ('{"choices": "x"}', "choices is a string, not an array"),
    ('{"choices": [5]}', "choices[0] is a number, not an object"),
    ('{"choices": [{"delta": "x"}]}', "choices[0].delta is a string, not an object"),
    ('{"choices": [{"delta": {"content": 5}}]}', "choices[0].delta.content is a number, not a string"),
    ('{"choices": [{"delta": {"reasoning": []}}]}', "choices[0].delta.reasoning is an array, not a string"),
    ('{"choices": [{"delta": {"tool_calls": "x"}}]}', "choices[0].delta.tool_calls is a string"),
    ('{"choices": [{"delta": {"tool_calls": [5]}}]}', "choices[0].delta.tool_calls[0] is a number"),
    ('{"choices": [{"delta": {"tool_calls": [{"function": "x"}]}}]}', "tool_calls[0].function is a string"),
    ('{"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}', "tool_calls[0].index is a string"),
    ('{"choices": [{"delta": {"tool_calls": [{"function": {"name": 5}}]}}]}', "function.name is a number"),
    ('{"choices": [{"finish_reason": 5}]}', "choices[0].finish_reason is a number, not a string"),
    ('{"choices": [{"token_ids": "x"}]}', "choices[0].token_ids is a string, not an array"),
    ('{"choices": [{"token_ids": [true]}]}', "choices[0].token_ids holds something other than token ids"),
    ('{"usage": "x"}', "usage is a string, not an object"),
    ('{"usage": {"completion_tokens": -1}}', "usage.completion_tokens is not a token count"),
    ('{"usage": {"completion_tokens": 1e30}}', "usage.completion_tokens is not a token count"),
    ('{"usage": {"completion_tokens": 1000000000000000000000000000000}}', "is not a token count"),
    ('{"usage": {"completion_tokens": true}}', "usage.completion_tokens is not a token count"),
    ('{"usage": {"prompt_tokens": "3"}}', "usage.prompt_tokens is not a token count"),
]


def _corpus(tmp_path: Path, ids: list[str]) -> Path:
    path = tmp_path / "shapes.jsonl"
    line = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    path.write_text("".join(json.dumps({"id": i} | line) + "\n" for i in ids))
    return path


@pytest.mark.timeout(120)
def test_every_wrong_shape_fails_its_row_and_the_run_goes_on(tmp_path: Path) -> None:
    ids = [f"s{i:02d}" for i in range(len(SHAPES))] + ["good"]
    events = {rid: [data, USAGE] for rid, (data, _) in zip(ids, SHAPES, strict=False)}
    events["good"] = [OK_CHUNK, USAGE]
    with scripted_server(tmp_path, events=events) as url:
        args = ReplayArgs(
            corpus=_corpus(tmp_path, ids), endpoint=url, label="shapes", out=tmp_path / "r", model="m",
            timeouts=Timeouts(silence_s=10),
        )  # fmt: skip
        (plan,) = plan_replay(args).plans
        (outcome,) = run_group([Member(plan)])
    assert (outcome.status, outcome.completed, outcome.failed) == ("finished", 1, len(SHAPES))
    rows = {r.request_id: r for r in plan.run.read_rows()}
    assert sorted(rows) == sorted(ids)  # every row written
    for rid, (_, named) in zip(ids, SHAPES, strict=False):
        assert rows[rid].status == "failed" and named in (rows[rid].error or ""), (rid, rows[rid].error)
    assert rows["good"].status == "completed" and rows["good"].completion_tokens == 2


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
# chunk-like objects: the keys the recorders read, with any values at any depth
DELTA = st.fixed_dictionaries(
    {}, optional=dict.fromkeys(("content", "reasoning", "reasoning_content", "tool_calls", "role"), JSON)
)
CHOICE = st.fixed_dictionaries({}, optional={"delta": DELTA | JSON, "finish_reason": JSON, "token_ids": JSON})
USAGES = st.fixed_dictionaries({}, optional=dict.fromkeys(("prompt_tokens", "completion_tokens"), JSON))
CHAT_EVENT = st.fixed_dictionaries({}, optional={"choices": st.lists(CHOICE | JSON, max_size=2) | JSON})
CHAT_EVENT = CHAT_EVENT | st.fixed_dictionaries({"usage": USAGES | JSON}) | JSON
META = st.fixed_dictionaries(
    {}, optional=dict.fromkeys(("prompt_tokens", "completion_tokens", "finish_reason"), JSON)
)
GENERATE_EVENT = st.fixed_dictionaries(
    {}, optional={"meta_info": META | JSON, "text": JSON, "output_ids": JSON}
)


def _check(recorder: StreamRecorder, events: list[object]) -> None:
    raw = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    assert recorder.feed(raw.encode(), 1) is True  # never raises: a bad event fails the row
    why = recorder.failure()
    if why is not None:
        assert isinstance(why, str) and "\n" not in why
        return
    for count in (recorder.completion_tokens, recorder.prompt_tokens):
        assert count is None or (type(count) is int and 0 <= count <= MAX_TOKEN_COUNT)
    assert recorder.completion_tokens is not None
    recorder.text_fields()


@pytest.mark.parametrize(
    ("recorder", "events"), [(ChatRecorder, CHAT_EVENT), (GenerateRecorder, GENERATE_EVENT)]
)
@settings(max_examples=350, deadline=None)
@given(data=st.data())
def test_a_recorder_fed_any_json_completes_with_valid_counts_or_fails_in_one_line(
    recorder: type[StreamRecorder], events: st.SearchStrategy[object], data: st.DataObject
) -> None:
    _check(recorder(), data.draw(st.lists(events, max_size=4), label="events"))
