"""Eq. 5 pooling, per-run rates, matched sets, bootstrap, and /metrics counter deltas."""

from __future__ import annotations

import pytest

from lumobench.metrics import parse_prometheus, phase_totals, spec_counters, spec_delta
from lumobench.rates import bootstrap_ci, matched_ids, paired_bootstrap_ratio, pooled, run_rates
from lumobench.results import RequestRow


def row(rid: str, run: int, n: int | None, decode_s: float, status: str = "completed") -> RequestRow:
    return RequestRow(
        run_index=run,
        seq=0,
        request_id=rid,
        status=status,
        completion_tokens=n,  # type: ignore[arg-type]
        t_send_ns=0,
        t_first_ns=1_000,
        t_end_ns=1_000 + int(decode_s * 1e9),
        started_at="t",
    )


def test_eq5_pools_tokens_and_times_not_rates() -> None:
    rows = [row("a", 0, 11, 1.0), row("b", 0, 101, 4.0), row("c", 0, 1, 9.0), row("d", 0, 50, 9.0, "failed")]
    total = pooled(rows)
    # (10 + 100) / (1 + 4): n = 1 and failed rows are excluded; not the mean of 10 and 25 tok/s
    assert total.tokens == 110 and total.seconds == pytest.approx(5.0) and total.requests == 2
    assert total.rate == pytest.approx(22.0)


def test_run_rates_and_matched_set() -> None:
    a = [row("x", 0, 11, 1.0), row("y", 0, 11, 2.0), row("x", 1, 21, 1.0), row("y", 1, 5, 1.0, "failed")]
    b = [row("x", 0, 3, 1.0), row("y", 0, 3, 1.0)]
    assert run_rates(a, 2) == [pytest.approx(20 / 3), pytest.approx(20.0)]
    assert matched_ids({"a": (a, ["x", "y"], 2), "b": (b, ["x", "y"], 1)}) == {"x"}
    assert matched_ids({"b": (b, ["x", "y"], 1)}) == {"x", "y"}


def test_bootstrap_interval_brackets_the_pooled_rate() -> None:
    rows = [row(f"r{i}", 0, 10 + 7 * i, 0.5 + 0.1 * i) for i in range(12)]
    lo, hi = bootstrap_ci(rows)  # type: ignore[misc]
    assert lo < pooled(rows).rate < hi  # type: ignore[operator]
    assert bootstrap_ci(rows[:1]) is None


def test_paired_bootstrap_ratio_resamples_requests_together_across_arms() -> None:
    # prompts of very different speed; the second arm is exactly twice as fast on every request
    base = [row(f"r{i}", 0, 10 + 40 * i, 0.2 + 1.5 * (i % 4)) for i in range(10)]  # 27-1645 tok/s
    twice = [row(r.request_id, 0, r.completion_tokens, r.decode_s / 2) for r in base]  # type: ignore[arg-type,operator]
    assert paired_bootstrap_ratio(base, twice) == (pytest.approx(2.0), pytest.approx(2.0))
    # while the two arms' own intervals overlap: pairing is what makes the ratio sharp
    assert bootstrap_ci(twice)[0] < bootstrap_ci(base)[1]  # type: ignore[index]
    # a noisy speed-up: the interval brackets the pooled ratio; only requests eligible in both count
    noisy = [
        row(r.request_id, 0, r.completion_tokens, r.decode_s / (1.5 + 0.1 * (i % 3)))
        for i, r in enumerate(base)
    ]  # type: ignore[arg-type,operator]
    lo, hi = paired_bootstrap_ratio(base, [*noisy, row("extra", 0, 500, 0.01)])  # type: ignore[misc]
    ratio = pooled(noisy).rate / pooled(base).rate  # type: ignore[operator]
    assert 1.5 <= lo < ratio < hi <= 1.7
    assert paired_bootstrap_ratio(base[:1], twice) is None


METRICS_BEFORE = """# HELP vllm:spec_decode_num_drafts_total drafts
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 50.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0
vllm:num_requests_running{model_name="m"} 0.0
"""


def test_accepted_per_event_and_per_position_rates_from_counter_deltas() -> None:
    after = (
        METRICS_BEFORE.replace("} 10.0", "} 30.0")
        .replace("} 20.0", "} 80.0")
        .replace('"0"} 9.0', '"0"} 29.0')
        .replace('"1"} 7.0', '"1"} 17.0')
    )
    delta = spec_delta(METRICS_BEFORE, after)
    assert delta is not None
    assert delta.accepted_per_event == pytest.approx(60 / 20)
    assert delta.per_position_rates() == [pytest.approx(1.0), pytest.approx(0.5)]
    assert spec_delta(after, METRICS_BEFORE) is None  # counters went backwards: server restarted
    assert spec_counters("vllm:num_requests_running 0\n") is None
    assert parse_prometheus(METRICS_BEFORE)["vllm:num_requests_running"] == [({"model_name": "m"}, 0.0)]


def test_phase_spans_are_deltas_per_phase_and_vanish_on_restart() -> None:
    before = (
        'lumotree:phase_seconds_sum{model_name="m",phase="target"} 1.0\n'
        'lumotree:phase_seconds_count{model_name="m",phase="target"} 10\n'
        'lumotree:phase_seconds_sum{model_name="m",phase="drafter"} 0.5\n'
        'lumotree:phase_seconds_count{model_name="m",phase="drafter"} 10\n'
    )
    after = (
        'lumotree:phase_seconds_sum{model_name="m",phase="target"} 4.0\n'
        'lumotree:phase_seconds_count{model_name="m",phase="target"} 110\n'
        'lumotree:phase_seconds_sum{model_name="m",phase="drafter"} 1.5\n'
        'lumotree:phase_seconds_count{model_name="m",phase="drafter"} 60\n'
    )
    assert phase_totals(before, after) == {"target": (3.0, 100.0), "drafter": (1.0, 50.0)}
    assert phase_totals(after, before) == {}  # went backwards: a restarted server
    assert phase_totals(METRICS_BEFORE, METRICS_BEFORE) == {}  # a server without phase timers
