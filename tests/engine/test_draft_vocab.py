"""Draft vocabularies (`lumotree.drafting.draft_vocab`): the file format and its checks, the
builder command, the CPU drafters' subset head, and the engine's outputs with one (unchanged)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.drafting.draft_vocab import (
    DraftVocabError,
    corpus_texts,
    load_draft_vocab,
    most_frequent,
    save_draft_vocab,
    subset_head,
)
from lumotree.drafting.mtp import MTPProposal
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import HybridLM, default_model_path
from lumotree.sampling import SamplingParams
from tests.engine.conftest import DEMO
from tests.engine.helpers import output_tokens, run_requests

HEAD = '{"format": "lumotree-draft-vocab/1", '
BUILD = [sys.executable, "-m", "lumotree.drafting.draft_vocab"]


def test_a_saved_draft_vocabulary_loads_sorted(tmp_path: Path) -> None:
    path = tmp_path / "dv.json"
    save_draft_vocab(path, [9, 2, 5], 16, "test")
    assert load_draft_vocab(path, 16).tolist() == [2, 5, 9]
    assert json.loads(path.read_text())["size"] == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not a JSON file"),
        ('{"token_ids": [1]}', "expected"),
        (HEAD + '"vocab_size": 32, "token_ids": [1]}', "made for a vocabulary of 32"),
        (HEAD + '"vocab_size": 16, "token_ids": [1, 16]}', "token id 16 outside"),
        (HEAD + '"vocab_size": 16, "token_ids": [3, 3]}', "repeat"),
        (HEAD + '"vocab_size": 16, "token_ids": []}', "no token ids"),
        (HEAD + '"vocab_size": 16, "token_ids": [1.5]}', "integers"),
    ],
)
def test_a_bad_draft_vocabulary_file_is_refused_with_the_reason(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "dv.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DraftVocabError, match=message):
        load_draft_vocab(path, 16)


def test_most_frequent_keeps_the_required_ids_then_the_commonest_lower_id_first() -> None:
    counts = Counter({7: 5, 3: 5, 11: 9, 4: 1, 2: 2})
    assert most_frequent(counts, 3, keep=(1,)) == [1, 3, 11]  # 7 ties with 3: the lower id wins
    assert most_frequent(counts, 10) == [2, 3, 4, 7, 11]  # fewer distinct tokens than asked


def test_the_subset_head_scores_the_subset_rows_and_masks_the_rest() -> None:
    g = torch.Generator().manual_seed(0)
    weight, hidden = torch.randn(64, 8, generator=g), torch.randn(5, 8, generator=g)
    ids = torch.tensor([3, 10, 11, 40, 63])
    logits = subset_head(weight, ids)(hidden)
    assert logits.shape == (5, 64)
    assert torch.equal(logits[:, ids], F.linear(hidden, weight[ids]))
    outside = torch.ones(64, dtype=torch.bool)
    outside[ids] = False
    assert bool(torch.isneginf(logits[:, outside]).all())
    assert set(logits.argmax(-1).tolist()) <= set(ids.tolist())


def test_the_builder_counts_the_corpus_tokens_and_keeps_eos(tmp_path: Path) -> None:
    out = tmp_path / "dv.json"
    run = subprocess.run(
        [*BUILD, str(DEMO), "--out", str(out), "--size", "300"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    ids = load_draft_vocab(out, 8192).tolist()
    assert len(ids) == 300 and 2 in ids  # the shipped model's EOS
    assert "300 of 8192 token ids" in run.stdout


def test_corpus_texts_skip_bookkeeping_fields(tmp_path: Path) -> None:
    """A replay's requests.jsonl row: its output text counts, its id, status and times do not."""
    rows = tmp_path / "requests.jsonl"
    row = {"request_id": "wal-t01", "status": "completed", "started_at": "2026-12-01T10:00:00",
           "text": "def f():", "tool_calls": [{"function": {"name": "edit", "arguments": "{}"}}]}  # fmt: skip
    rows.write_text(json.dumps(row) + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    assert list(corpus_texts(rows)) == ["def f():", "edit", "{}", "hi"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DraftVocabError, match=r"broken\.jsonl:2"):
        list(corpus_texts(broken))


def test_the_builder_refuses_a_missing_corpus_without_a_traceback(tmp_path: Path) -> None:
    run = subprocess.run(
        [*BUILD, str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "dv.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "error:" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "dv.json").exists()


def _tree_engine(**changes: object) -> LLMEngine:
    return LLMEngine(EngineConfig(drafter="tree", prefix_cache=False, max_model_len=2048, **changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("kernels", ["cpu-native", "cpu-fast"])
def test_the_engine_drafts_only_from_the_draft_vocabulary_and_emits_the_same_tokens(
    tmp_path: Path, model: HybridLM, demo_prompts: list[GenerationRequest], kernels: str
) -> None:
    """The shipped model, greedy, the tree drafter on the native and the PyTorch CPU forward: with a
    draft vocabulary of its 512 most frequent demo-corpus tokens the MTP drafts all come from it
    and the output is unchanged."""
    path = tmp_path / "dv.json"
    subprocess.run(
        [*BUILD, str(DEMO), "--out", str(path), "--size", "512"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    ids = set(load_draft_vocab(path, model.config.vocab_size).tolist())
    prompt = next(p for p in demo_prompts if p.request_id == "wal-t04")
    request = GenerationRequest("g", prompt.prompt_token_ids, SamplingParams(0.0), 40)
    plain = output_tokens(run_requests(_tree_engine(kernels=kernels), [request])["g"])
    engine = _tree_engine(kernels=kernels, draft_vocab=path)
    assert engine.config.kernels == kernels
    drafted: list[int] = []
    mtp = engine.runner.mtp
    assert mtp is not None
    propose = mtp.propose

    def record(hidden: Tensor, next_tokens: list[int]) -> MTPProposal:
        proposal = propose(hidden, next_tokens)
        drafted.extend([*proposal.spine, *(t for ranked in proposal.topk for t in ranked)])
        return proposal

    mtp.propose = record
    assert output_tokens(run_requests(engine, [request])["g"]) == plain
    assert drafted and set(drafted) <= ids
    assert engine.metrics().spec.num_accepted_tokens > 0


def test_a_draft_vocabulary_smaller_than_the_ranked_candidates_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dv.json"
    save_draft_vocab(path, [5, 9], 8192, "test")
    with pytest.raises(ValueError, match="cannot rank 3 candidates"):
        _tree_engine(draft_vocab=path, model=default_model_path())
