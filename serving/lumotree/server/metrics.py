"""`GET /metrics`: the engine's counters as Prometheus text, with vLLM's metric names.

Speculative decoding uses vLLM's counters (drafts = speculative events, draft tokens, accepted drafts,
accepted per position 0..depth-1), so lumobench reads this server exactly as it reads vLLM. The latency
histograms and the KV-cache gauge are vLLM's too, so a stock vLLM dashboard fills every panel it can.
LumoTree's phase spans (target / drafter / dispatch, and prefill) are summaries: `_sum` seconds and
`_count`.
"""

from __future__ import annotations

from lumotree.engine.metrics import EngineMetrics, Histogram

SPEC_PREFIX = "vllm:spec_decode_"
# The engine's finish reasons (TokenEvent.finish_reason).
FINISH_REASONS = ("stop", "length", "abort", "error")


def _labels(**labels: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    # exact integers for counters (no 1.2e+06 rounding), full precision otherwise
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class _Writer:
    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]
    ) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        base = name.removesuffix("_total") if kind == "counter" else name
        for labels, value in samples:
            suffix = "_total" if kind == "counter" else ""
            self.lines.append(f"{base}{suffix}{_labels(model_name=self.model, **labels)} {_num(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.family(name, kind, help_text, [({}, value)])

    def histogram(self, name: str, help_text: str, h: Histogram) -> None:
        """Cumulative `_bucket{le}` series (+Inf last), `_sum` and `_count`."""
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip([*map(repr, map(float, h.bounds)), "+Inf"], h.counts, strict=True):
            running += n
            self.lines.append(f"{name}_bucket{_labels(model_name=self.model, le=bound)} {running}")
        self.lines.append(f"{name}_sum{_labels(model_name=self.model)} {_num(h.total)}")
        self.lines.append(f"{name}_count{_labels(model_name=self.model)} {running}")


def render_metrics(m: EngineMetrics, model_name: str) -> str:
    """Prometheus text exposition (version 0.0.4) of one engine snapshot."""
    w = _Writer(model_name)
    w.one(
        SPEC_PREFIX + "num_drafts_total",
        "counter",
        "Speculative events (cycles that verified drafts).",
        m.spec.num_drafts,
    )
    w.one(
        SPEC_PREFIX + "num_draft_tokens_total", "counter", "Draft tokens verified.", m.spec.num_draft_tokens
    )
    w.one(
        SPEC_PREFIX + "num_accepted_tokens_total",
        "counter",
        "Draft tokens accepted (bonus/correction tokens excluded).",
        m.spec.num_accepted_tokens,
    )
    w.family(
        SPEC_PREFIX + "num_accepted_tokens_per_pos_total",
        "counter",
        "Speculative events that accepted a draft at this position (0 = first draft).",
        [({"position": str(p)}, n) for p, n in enumerate(m.spec.accepted_per_pos)],
    )
    w.one("vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", m.prompt_tokens)
    w.one("vllm:generation_tokens_total", "counter", "Tokens generated.", m.generation_tokens)
    w.family(
        "vllm:request_success_total",
        "counter",
        "Finished requests by finish reason.",
        # every reason is exported from the start (as vLLM does), so a delta from a fresh server works
        [
            ({"finished_reason": r}, m.requests_finished.get(r, 0))
            for r in sorted({*FINISH_REASONS, *m.requests_finished})
        ],
    )
    w.one(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        m.prefix_cache_queries,
    )
    w.one(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        m.prefix_cache_hits,
    )
    w.one(
        "lumotree:prefix_cache_hit_rate",
        "gauge",
        "Prefix-cache hits / queries since start.",
        m.prefix_cache_hit_rate,
    )
    w.one("vllm:num_requests_running", "gauge", "Requests in prefill or decode.", m.running)
    w.one("vllm:num_requests_waiting", "gauge", "Requests waiting in the queue.", m.waiting)
    w.one(
        "lumotree:device_syncs_total",
        "counter",
        "Device-to-host synchronisations made by decode cycles (the device path makes one per cycle).",
        m.device_syncs,
    )
    w.one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", m.kv_cache_usage)
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        m.time_to_first_token,
    )
    w.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        m.inter_token_latency,
    )
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        m.e2e_request_latency,
    )
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        m.request_queue_time,
    )
    # the rest of vLLM 0.32's request histograms, with its help texts (a stock dashboard's panels)
    for name, help_text, h in (
        ("request_inference_time_seconds", "time spent in RUNNING phase for request",
         m.request_inference_time),
        ("request_prefill_time_seconds", "time spent in PREFILL phase for request", m.request_prefill_time),
        ("request_decode_time_seconds", "time spent in DECODE phase for request", m.request_decode_time),
        ("request_time_per_output_token_seconds", "time_per_output_token_seconds per request",
         m.request_time_per_output_token),
        ("request_max_num_generation_tokens", "maximum number of requested generation tokens",
         m.request_max_num_generation_tokens),
        ("iteration_tokens_total", "number of tokens per engine_step", m.iteration_tokens),
    ):  # fmt: skip
        w.histogram(f"vllm:{name}", f"Histogram of {help_text}.", h)
    w.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", m.request_prompt_tokens)
    w.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        m.request_generation_tokens,
    )
    name = "lumotree:phase_seconds"
    w.lines += [
        f"# HELP {name} Wall time of engine phases: target forward, drafter, dispatch (acceptance + "
        "path handling + publication), prefill.",
        f"# TYPE {name} summary",
    ]
    for phase, span in m.spans.items():
        labels = _labels(model_name=model_name, phase=phase)
        w.lines += [f"{name}_sum{labels} {_num(span.seconds)}", f"{name}_count{labels} {span.count}"]
    return "\n".join(w.lines) + "\n"
