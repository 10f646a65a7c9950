"""Forced-acceptance schedules (speed work): a mean becomes floor/ceil counts averaging it, counts
are taken as given, a spec histogram gives counts in its proportions, bad specs are refused with
the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.sampling.forced import ForcedAcceptance, ForcedAcceptanceError, forced_path, mean_schedule


@settings(max_examples=50, deadline=None)
@given(st.floats(0.0, 11.0))
def test_a_mean_schedule_averages_the_mean(mean: float) -> None:
    counts = mean_schedule(mean)
    assert abs(sum(counts) / len(counts) - mean) <= 0.5 / len(counts) + 1e-9
    assert set(counts) <= {int(mean), int(mean) + 1}


def test_specs_parse_to_their_schedules(tmp_path: Path) -> None:
    assert ForcedAcceptance.parse("paper", "tree").mean == pytest.approx(4.05, abs=1 / 64)
    assert ForcedAcceptance.parse("paper", "mtp").mean == pytest.approx(3.17, abs=1 / 64)
    assert ForcedAcceptance.parse("0,4,5", "tree").counts == (0, 4, 5)
    hist = tmp_path / "h.json"  # 10 events: 2 accept nothing, 3 one draft, 5 two drafts
    hist.write_text(json.dumps({"tree": {"num_drafts": 10, "accepted_per_pos": [8, 5]}}))
    counts = ForcedAcceptance.parse(f"hist:{hist}", "tree").counts
    assert sorted(set(counts)) == [0, 1, 2] and sum(counts) / len(counts) == pytest.approx(1.3, abs=0.05)


@pytest.mark.parametrize(
    ("spec", "drafter", "match"),
    [
        ("fast", "tree", "expected paper"),
        ("-1", "tree", ">= 0"),
        ("1.5,2", "mtp", "whole counts"),
        ("paper", "ar", "drafting arm"),
        ("hist:/no/such/file.json", "tree", "histogram"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(spec: str, drafter: str, match: str) -> None:
    with pytest.raises(ForcedAcceptanceError, match=match):
        ForcedAcceptance.parse(spec, drafter)


def test_a_forced_path_stops_at_the_end_of_the_spine() -> None:
    tokens = [7, 8, 9, 10, 11]
    assert forced_path([0, 1, 3], tokens, 1) == ([0, 1], [8])
    assert forced_path([0, 1, 3], tokens, 9) == ([0, 1, 3], [8, 10])
    assert forced_path([0], tokens, 4) == ([0], [])
