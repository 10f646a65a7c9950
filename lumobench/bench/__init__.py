"""Every benchmark of the project, one module or folder each, each a `lumobench bench VERB`
(lumobench/commands/bench.py lists them): `client/` (the replay client's overhead), `engine.py` (the
LumoTree engine on CPU in one process), `prefill.py`, `draft_vocab.py`, `kernels/` (the Triton kernels
on a GPU, and `ablate_gdn.py`), `skinny_gemm.py`, `cycle.py` and `cycle_profile.py` (the device
cycle), `row_invariance.py` (a verified row's bits against the one-row step's), `loop.py` (the real
loop against its device cycle), `arm_memory.py`, `server_memory.py`,
`metrics_delta.py`; `timing.py` and `output.py` are shared; `device/*.sh` are the device-machine runs.
"""
