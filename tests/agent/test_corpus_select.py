"""`corpus select`: proportional allocation across conversations, spacing through capture order, and a
frozen manifest that replay's manifest check accepts."""

from __future__ import annotations

import json

import pytest

from lumobench.corpus import load_corpus
from lumobench.corpus_select import RULE, allocate, freeze_selection, select_records, spaced
from lumobench.errors import LumobenchError
from lumobench.manifest import select_by_manifest

# the paper's disjoint corpus: 61 captured requests in five conversations, 43 selected
SIZES = {"a": 20, "b": 15, "c": 12, "d": 9, "e": 5}


def test_allocation_is_proportional_and_sums_to_n():
    shares = allocate(SIZES, 43)
    assert sum(shares.values()) == 43
    for group, size in SIZES.items():
        assert abs(shares[group] - 43 * size / 61) < 1 and shares[group] <= size
    assert allocate({"x": 3, "y": 3}, 3) == {"x": 2, "y": 1}  # ties go to the earlier conversation
    assert allocate(SIZES, 61) == SIZES
    with pytest.raises(LumobenchError, match="cannot select 62 of 61"):
        allocate(SIZES, 62)


def test_spacing_spreads_picks_over_capture_order():
    assert spaced(10, 5) == [1, 3, 5, 7, 9]
    assert spaced(20, 14) == sorted(set(spaced(20, 14)))
    assert spaced(7, 7) == list(range(7))
    assert spaced(9, 1) == [4]


def _corpus(path, sizes):
    lines = []
    for conversation, size in sizes.items():
        for turn in range(size):
            lines.append(
                {
                    "id": f"{conversation}-{turn}",
                    "messages": [{"role": "user", "content": f"{conversation} {turn}"}],
                    "max_tokens": 1024,
                    "source": {"task": "t", "conversation": conversation, "turn": turn},
                }
            )
    # capture order interleaves conversations, as two agents' requests would
    lines.sort(key=lambda r: (r["source"]["turn"], r["source"]["conversation"]))
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_selection_keeps_capture_order_and_freezes_a_replayable_manifest(tmp_path):
    corpus = _corpus(tmp_path / "captured.jsonl", SIZES)
    records = load_corpus(corpus)
    selected, shares = select_records(records, 43)
    positions = [records.index(r) for r in selected]
    assert positions == sorted(positions) and len(set(positions)) == 43
    per_conversation = {c: sum(r.source.conversation == c for r in selected) for c in SIZES}
    assert per_conversation == {c.split("/")[1]: k for c, k in shares.items()}
    turns_a = [r.source.turn for r in selected if r.source.conversation == "a"]
    assert turns_a[0] <= 1 and turns_a[-1] >= 18  # spread from early to late in the conversation

    manifest = freeze_selection(corpus, records, 43)
    assert manifest.selection.rule == RULE and manifest.selection.params["of"] == 61
    assert [r.id for r in select_by_manifest(manifest, corpus, records)] == [r.id for r in selected]
