"""Draft selection: argmax with the lowest index on ties, ordered top-k by (value desc, index asc)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumobench.checks.structure_checks import check_selection, oracle_topk
from lumotree.drafting import argmax_lowest_index, mtp_proposals, ordered_topk


def test_argmax_picks_the_lowest_index_among_tied_maxima() -> None:
    x = torch.tensor([0.0, 3.0, 1.0, 3.0, 3.0])
    assert int(argmax_lowest_index(x)) == 1
    batch = torch.tensor([[1.0, 1.0], [0.0, 2.0], [float("-inf"), float("-inf")]])
    assert argmax_lowest_index(batch).tolist() == [0, 1, 0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=3, max_size=40), st.integers(1, 3))
def test_ordered_topk_equals_python_sort_on_tie_heavy_rows(values: list[int], k: int) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    assert ordered_topk(x, k).tolist() == oracle_topk([float(v) for v in values], k)
    assert int(argmax_lowest_index(x)) == oracle_topk([float(v) for v in values], 1)[0]


def test_selection_does_not_depend_on_torch_topk_tie_order(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.tensor([[2.0, 5.0, 5.0, 1.0, 5.0, 2.0]] * 3)
    want_spine, want_top3 = argmax_lowest_index(x), ordered_topk(x, 3)
    real_topk = torch.topk

    def tie_reversing_topk(t: torch.Tensor, k: int, *args: object, **kw: object) -> object:
        # A legal torch.topk result whose tied entries come highest index first.
        flipped = real_topk(t.flip(-1), k, *args, **kw)
        return torch.return_types.topk((flipped.values, t.shape[-1] - 1 - flipped.indices))

    monkeypatch.setattr(torch, "topk", tie_reversing_topk)
    assert torch.topk(x, 3).indices[0].tolist() != [1, 2, 4]  # the adversarial order is really in effect
    assert torch.equal(argmax_lowest_index(x), want_spine) and torch.equal(ordered_topk(x, 3), want_top3)
    spine, top3 = mtp_proposals(x)
    assert spine == [1, 1, 1] and top3 == [[1, 2, 4]] * 3


def test_selection_rejects_nan_and_bad_k() -> None:
    with pytest.raises(ValueError, match="NaN"):
        argmax_lowest_index(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="k must be"):
        ordered_topk(torch.zeros(4), 5)


def test_selection_check_catches_tie_order_faults() -> None:
    result = check_selection(12, seed=1)
    assert result.ok and result.faults_planted == 2 and result.cases == 13
