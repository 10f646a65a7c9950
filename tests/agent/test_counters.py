"""Deltas of the arm's /metrics counters around one attempt."""

from __future__ import annotations

import pytest

from lumobench.agent.counters import counter_deltas

BEFORE = """# HELP vllm:request_success_total Count of successfully processed requests.
vllm:request_success_total{finished_reason="stop",model_name="m"} 10
vllm:request_success_total{finished_reason="length",model_name="m"} 2
vllm:generation_tokens_total{model_name="m"} 5000
vllm:spec_decode_num_drafts_total{model_name="m"} 100
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 250
"""
AFTER = """vllm:request_success_total{finished_reason="stop",model_name="m"} 17
vllm:request_success_total{finished_reason="length",model_name="m"} 3
vllm:generation_tokens_total{model_name="m"} 9000
vllm:spec_decode_num_drafts_total{model_name="m"} 300
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 850
"""


def test_counter_deltas_sum_label_sets_and_give_accepted_per_event():
    deltas = counter_deltas(BEFORE, AFTER)
    assert (deltas.requests, deltas.output_tokens) == (8, 4000)
    assert deltas.accepted_per_event == pytest.approx(600 / 200)


def test_missing_or_restarted_counters_give_none():
    assert counter_deltas(None, AFTER).requests is None
    restarted = counter_deltas(AFTER, BEFORE)
    assert (restarted.requests, restarted.output_tokens, restarted.accepted_per_event) == (None, None, None)
    plain = counter_deltas("up 1\n", "up 1\n")
    assert (plain.requests, plain.output_tokens, plain.accepted_per_event) == (None, None, None)
