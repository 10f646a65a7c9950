"""The host runner writes the prompt's MTP rows on a worker thread: the call returns at once, the
store after them runs once they are written, and everything that reads the MTP cache waits; the
engine emits a request's first token only once they are written (prefill work stays out of the
decode window).

`SlowMTP` is a fake MTP source standing for a drafter whose prompt pass takes long: its commit
blocks until the test releases it, and it records what it was given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from lumotree.drafting.mtp import MTPProposal
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.engine.model_runner import ModelRunner
from lumotree.model import HybridLM
from lumotree.model.state import KVCache
from lumotree.sampling import SamplingParams
from lumotree.verify.kernel_sets import CPU_FAST


class SlowMTP:
    """Commits block on `release`; `fail` makes the next commit raise."""

    depth, k = 1, 1

    def __init__(self) -> None:
        self.release = threading.Event()
        self.committed: list[list[int]] = []
        self.fail = False

    @property
    def cache(self) -> KVCache:
        raise AssertionError("not read here")

    def reset(self, committed: int = 0) -> None:
        assert not self.committed or self.release.is_set(), "reset while a commit runs"

    def commit(self, hidden: Tensor, next_tokens: Sequence[int]) -> None:
        assert self.release.wait(10), "never released"
        if self.fail:
            raise RuntimeError("the MTP pass failed")
        self.committed.append(list(next_tokens))

    def propose(self, hidden: Tensor, next_tokens: Sequence[int]) -> MTPProposal:
        return MTPProposal([len(self.committed)], [[len(self.committed)]])


@pytest.fixture
def runner(model: HybridLM) -> tuple[ModelRunner, SlowMTP]:
    runner = ModelRunner(model, 64, 1, CPU_FAST, None)
    mtp = SlowMTP()
    runner.mtp = mtp
    return runner, mtp


def test_the_commit_returns_before_the_rows_are_written_and_the_proposal_waits(
    runner: tuple[ModelRunner, SlowMTP],
) -> None:
    run, mtp = runner
    stored: list[int] = []
    hidden = torch.zeros(3, run.model.config.hidden_size)
    run.commit_mtp_rows(hidden, [1, 2, 3], then=lambda: stored.append(len(mtp.committed)))
    run.commit_mtp_rows(hidden[:1], [4])
    assert mtp.committed == [] and stored == []  # both still queued behind the blocked pass
    threading.Timer(0.05, mtp.release.set).start()
    proposal = run.start_decode(hidden[:1], 5)  # settles first: both chunks, in order
    assert mtp.committed == [[1, 2, 3], [4]] and stored == [1]
    assert proposal is not None and proposal.spine == [2]


def test_a_failed_commit_is_raised_where_the_runner_settles(runner: tuple[ModelRunner, SlowMTP]) -> None:
    run, mtp = runner
    stored: list[int] = []
    mtp.fail = True
    mtp.release.set()
    run.commit_mtp_rows(torch.zeros(1, run.model.config.hidden_size), [1], then=lambda: stored.append(1))
    with pytest.raises(RuntimeError, match="the MTP pass failed"):
        run.reset()
    assert stored == []  # the store after a failed pass never runs
    mtp.fail = False
    run.reset()  # the failure was reported once; the runner goes on


def test_the_first_token_goes_out_after_the_prompts_mtp_rows_are_written(
    demo_prompts: list[GenerationRequest],
) -> None:
    engine = LLMEngine(EngineConfig(drafter="mtp", max_model_len=4096, prefix_cache=False))
    mtp = engine.runner.mtp
    assert mtp is not None
    commit, written = mtp.commit, threading.Event()

    def slow_commit(hidden: Tensor, next_tokens: Sequence[int]) -> None:
        time.sleep(0.3)  # a prompt pass that outlasts the first token's logits and sampling
        commit(hidden, next_tokens)
        written.set()

    mtp.commit = slow_commit  # type: ignore[method-assign]
    prompt = min(demo_prompts, key=lambda p: len(p.prompt_token_ids)).prompt_token_ids
    engine.add_request(GenerationRequest("first", prompt, SamplingParams(0.0), 4))
    first: list[int] = []
    while not first:
        first = [t for event in engine.step() for t in event.token_ids]
    assert written.is_set(), "the first token was emitted while the prompt's MTP rows were being written"
