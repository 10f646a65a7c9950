"""Where a decode step of vLLM's CPU build goes, in-process: `vllm.LLM` (bf16, compiled unless
--eager, concurrency 1) with the LumoTree plugin's tree (or vLLM's own MTP-5 with --vllm-mtp5)
replays the greedy demo corpus after two warm-up requests, with timers around vLLM's and the
plugin's functions; prints and writes ms per decode step (prefill steps apart) and the output
tokens (compare two runs' `outputs` to check that a change kept every token).

    lumobench bench vllm-step OUT.json [--eager] [--vllm-mtp5]
    (or .cache/vllm-cpu/bin/python -P -m lumobench.bench.vllm_step OUT.json ...)

Runs in the vLLM CPU venv (`python -m lumobench.vllm_cpu` builds it, with this checkout): from
another environment the command runs itself there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from lumobench.arms import REPO_ROOT
from lumobench.vllm_cpu import VENV_DIR
from lumobench.vllm_cpu.env import venv_python

MODEL = REPO_ROOT / ".cache" / "lumo-tiny-coder-qwen3-next"
CORPUS = REPO_ROOT / "corpora" / "demo-greedy.jsonl"
#: what the vLLM arms' servers set (serving/arms/vllm-cpu-lumotree.toml), and vLLM in this process
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "LUMOTREE_VLLM_DRAFTER": "tree",
}
STEP_END = "sample_tokens"  # the timer whose end closes a step


class StepTimes:
    """Seconds per timer key, summed over the steps of each kind ("decode" or "prefill")."""

    def __init__(self) -> None:
        self.kind = "decode"
        self._current: dict[str, float] = defaultdict(float)
        self.totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.steps: dict[str, int] = defaultdict(int)

    def add(self, key: str, seconds: float) -> None:
        """A timed call ended; the STEP_END key closes the step under the current kind."""
        self._current[key] += seconds
        if key == STEP_END:
            for k, v in self._current.items():
                self.totals[self.kind][k] += v
            self.steps[self.kind] += 1
            self._current.clear()

    def ms_per_step(self, kind: str) -> dict[str, float]:
        """Mean milliseconds per step of `kind` for every key."""
        n = self.steps[kind]
        return {k: 1000 * v / n for k, v in sorted(self.totals[kind].items())} if n else {}

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]


def _timed(times: StepTimes, owner: Any, name: str, key: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times.add(key, time.perf_counter() - start)

    setattr(owner, name, timed)


def _instrument(times: StepTimes, plugin: bool) -> None:
    from vllm import _custom_ops
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    execute = GPUModelRunner.execute_model

    def execute_model(runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        times.kind = "decode" if is_decode(scheduler_output) else "prefill"
        start = time.perf_counter()
        try:
            return execute(runner, scheduler_output, *args, **kwargs)
        finally:
            times.add("execute_model", time.perf_counter() - start)

    GPUModelRunner.execute_model = execute_model  # type: ignore[method-assign]
    _timed(times, GPUModelRunner, STEP_END, STEP_END)
    _timed(times, GPUModelRunner, "propose_draft_token_ids", "propose")
    _timed(times, CPUAttentionBackendImpl, "forward", "attention (vLLM's and the plugin's)")
    _timed(times, _custom_ops, "cpu_attention_with_kv_cache", "attention: vLLM's kernel")
    _timed(times, Qwen3NextForCausalLM, "compute_logits", "logits")
    if not plugin:
        return
    from lumotree.vllm import sampler
    from lumotree.vllm.worker import get_worker

    worker = get_worker()
    assert worker is not None
    for name in ("prepare_inputs", "gdn", "attention", "sample", "propose"):
        _timed(times, worker, name, f"plugin.{name}")
    _timed(times, sampler, "walk", "plugin.walk")
    _timed(times, sampler, "publish_accepted", "plugin.publish")


def is_decode(scheduler_output: Any) -> bool:
    """A step of decoding only: no new request, each scheduled request its last token and drafts."""
    drafts = scheduler_output.scheduled_spec_decode_tokens
    return not scheduler_output.scheduled_new_reqs and all(
        count == 1 + len(drafts.get(req_id, ()))
        for req_id, count in scheduler_output.num_scheduled_tokens.items()
    )


def vllm_step_command(
    out: Annotated[Path, typer.Argument(help="JSON: ms per decode step by timer, steps, tokens, outputs")],
    eager: Annotated[bool, typer.Option(help="--enforce-eager (default: compiled, as the arms run)")] = False,
    vllm_mtp5: Annotated[bool, typer.Option(help="vLLM's own MTP-5 instead of the plugin's tree")] = False,
) -> None:
    """ms per decode step of vLLM CPU with the plugin (or vLLM's MTP-5), in-process, bf16."""
    if importlib.util.find_spec("vllm") is None:  # not the vLLM venv: run there
        python = str(venv_python(VENV_DIR))
        flags = [f for f, on in (("--eager", eager), ("--vllm-mtp5", vllm_mtp5)) if on]
        os.execv(python, [python, "-P", "-m", "lumobench.bench.vllm_step", str(out.resolve()), *flags])
    os.environ.update(ENV, LUMOTREE_VLLM="0" if vllm_mtp5 else "1")
    from vllm import LLM, SamplingParams

    spec = (
        {"method": "mtp", "num_speculative_tokens": 5}
        if vllm_mtp5
        else {
            "method": "custom_class",
            "model": "lumotree.vllm.proposer.LumoTreeProposer",
            "num_speculative_tokens": 27,
        }
    )
    llm = LLM(
        model=str(MODEL),
        dtype="bfloat16",
        max_model_len=8192,
        max_num_seqs=1,
        enable_prefix_caching=False,
        max_num_batched_tokens=8192,
        enforce_eager=eager,
        speculative_config=spec,
    )
    times = StepTimes()
    _instrument(times, plugin=not vllm_mtp5)
    records = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]

    def run(record: dict[str, Any]) -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=record["max_tokens"])
        answer = llm.chat(record["messages"], params, tools=record.get("tools"), use_tqdm=False)
        return list(answer[0].outputs[0].token_ids)

    for record in records[:2]:
        run(record)
    times.clear()
    start = time.perf_counter()
    outputs = {r["id"]: run(r) for r in records}
    wall = time.perf_counter() - start
    steps = times.steps["decode"]
    tokens = sum(len(t) - 1 for t in outputs.values())  # the first token comes from the prefill step
    result = {
        "arm": "vllm-mtp5" if vllm_mtp5 else "plugin tree",
        "eager": eager,
        "wall_s": wall,
        "decode_steps": steps,
        "tokens_per_decode_step": tokens / steps if steps else None,
        "step_ms": sum(times.ms_per_step("decode").get(k, 0.0) for k in ("execute_model", STEP_END)),
        "decode_ms": times.ms_per_step("decode"),
        "prefill_ms": times.ms_per_step("prefill"),
        "outputs": outputs,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    typer.echo(json.dumps({k: v for k, v in result.items() if k != "outputs"}, indent=1))


if __name__ == "__main__":
    typer.run(vllm_step_command)
