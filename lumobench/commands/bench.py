"""`lumobench bench VERB`: every benchmark of the project (`bench_app`); each lives in lumobench/bench/,
and the ones that were run as `python -m lumobench.bench.X` still are (the same command)."""

from __future__ import annotations

import typer

from lumobench.bench.arm_memory import arm_memory_command
from lumobench.bench.attention import attention_command
from lumobench.bench.client.command import client_command
from lumobench.bench.cycle import cycle_command
from lumobench.bench.cycle_profile import cycle_profile_command
from lumobench.bench.draft_vocab import draft_vocab_command
from lumobench.bench.engine import engine_command
from lumobench.bench.gdn_forms import gdn_forms_command
from lumobench.bench.gdn_variants import gdn_variants_app
from lumobench.bench.kernels.ablate_gdn import ablate_gdn_command
from lumobench.bench.kernels.command import kernels_command
from lumobench.bench.loop import loop_app
from lumobench.bench.metrics_delta import metrics_delta_command
from lumobench.bench.prefill import prefill_command
from lumobench.bench.read_floor import read_floor_command
from lumobench.bench.row_invariance import row_invariance_command
from lumobench.bench.server_memory import server_memory_command
from lumobench.bench.skinny_gemm import skinny_gemm_command
from lumobench.bench.vllm_step import vllm_step_command

bench_app = typer.Typer(
    help="Benchmarks: the client, the engine on CPU, prefill, the GPU kernels, cycle and loop, memory.",
    no_args_is_help=True,
)
# CPU: the harness's client, the engine in one process, time to first token, draft vocabularies
bench_app.command("client")(client_command)
bench_app.command("engine")(engine_command)
bench_app.command("prefill")(prefill_command)
bench_app.command("draft-vocab")(draft_vocab_command)
# CUDA GPU: the kernels (and a GDN ablation), the skinny GEMM, the decode cycle and its profile,
# whether a verified row has the one-row step's bits, the GDN verification forms side by side
bench_app.command("kernels")(kernels_command)
bench_app.command("ablate-gdn")(ablate_gdn_command)
bench_app.command("skinny-gemm")(skinny_gemm_command)
bench_app.command("read-floor")(read_floor_command)
bench_app.command("attention")(attention_command)
bench_app.command("cycle")(cycle_command)
bench_app.command("cycle-profile")(cycle_profile_command)
bench_app.command("row-invariance")(row_invariance_command)
bench_app.command("gdn-forms")(gdn_forms_command)
bench_app.add_typer(gdn_variants_app, name="gdn-variants")  # git revisions' scans side by side
# the real loop through the server and harness against its device cycle
bench_app.add_typer(loop_app, name="loop")
# servers: an arm's resident memory, the LumoTree server under large bodies, /metrics deltas
bench_app.command("arm-memory")(arm_memory_command)
bench_app.command("server-memory")(server_memory_command)
bench_app.command("metrics-delta")(metrics_delta_command)
# vLLM's CPU build in-process: where a decode step goes, with the LumoTree plugin or vLLM's MTP-5
bench_app.command("vllm-step")(vllm_step_command)
