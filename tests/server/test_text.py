"""Tokenizer bytes, streaming detokenization and stop strings on the shipped model's tokenizer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.server.detokenizer import REPLACEMENT, IncrementalDetokenizer, StopStringMatcher
from lumotree.server.tokenizer import ModelTokenizer

MULTIBYTE = "héllo 世界 🙂 naïve → ∑ <think>x</think> done"


def stream(tok: ModelTokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    return [*pieces, detok.flush()]


def test_token_bytes_concatenate_to_the_utf8_text(tokenizer: ModelTokenizer) -> None:
    ids = tokenizer.encode(MULTIBYTE)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == MULTIBYTE.encode()
    # the emoji is split over several byte tokens, so single-token text is a replacement character
    assert any(tokenizer.token_text(i) == REPLACEMENT for i in ids)


def test_streamed_pieces_never_split_a_character(tokenizer: ModelTokenizer) -> None:
    ids = tokenizer.encode(MULTIBYTE)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == MULTIBYTE
    assert all(REPLACEMENT not in p for p in pieces)
    # pieces are released only at character boundaries: a split emoji arrives whole
    assert "🙂" in "".join(p for p in pieces if "🙂" in p)
    assert sum(p == "" for p in pieces) >= 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=8191), max_size=40))
def test_streamed_text_equals_one_shot_decoding_for_any_ids(
    tokenizer: ModelTokenizer, ids: list[int]
) -> None:
    tok = tokenizer
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    # only the final flush may carry an unfinished character
    assert all(not p.endswith(REPLACEMENT) or REPLACEMENT in tok.decode(ids) for p in pieces[:-1])


def test_special_tokens_are_skipped_and_markup_tokens_kept(tokenizer: ModelTokenizer) -> None:
    ids = tokenizer.encode("<think>a</think>b<|im_end|>")
    assert "".join(stream(tokenizer, ids)) == "<think>a</think>b"
    keep = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join([keep.push(i) for i in ids] + [keep.flush()]).endswith("<|im_end|>")


def test_stop_string_split_across_pieces_is_trimmed() -> None:
    m = StopStringMatcher(["STOP", "\n\n"])
    out = [m.push(p) for p in ["abc S", "T", "OP tail"]]
    assert out == ["abc ", "", ""] and m.matched == "STOP"
    assert m.push("more") == ""


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.push("xS") == "x"
    assert m.push("TAR") == "STAR"
    assert m.push("ST") == ""
    assert m.flush() == "ST" and m.matched is None


def test_earliest_stop_string_wins_and_can_be_kept() -> None:
    m = StopStringMatcher(["b", "ab"], include_stop=True)
    assert m.push("xxab") == "xxab" and m.matched == "ab"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abS TOP\n", max_size=40), st.lists(st.integers(1, 6), max_size=12))
def test_stop_matching_does_not_depend_on_how_text_is_split(text: str, cuts: list[int]) -> None:
    stops = ["STOP", "TT", "\n\n"]
    at = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(at)] if at else text
    m, out, pos = StopStringMatcher(stops), [], 0
    for c in [*cuts, len(text)]:
        out.append(m.push(text[pos : pos + c]))
        pos += c
    assert "".join(out) + m.flush() == expected
