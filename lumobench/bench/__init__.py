"""Every benchmark of the project, one module or folder each: `kernels/` (the Triton kernels on a
GPU, `lumobench bench kernels`), `engine.py` (the LumoTree engine on CPU in one process, `lumobench
bench engine`), `client/` (the replay client's overhead, `lumobench bench client`), `timing.py` (the
shared timer), `device/run_h200.sh` (the device-machine run of the kernel benchmark)."""
