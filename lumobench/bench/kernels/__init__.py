"""The LumoTree kernel benchmark on a CUDA GPU (`lumobench bench kernels`): `command.py` runs the
suites and writes kernels.json / kernels.md (`report.py`); `gdn.py` is the GDN verify + publish suite,
`decode.py` the attention, selection, walk and commit suites, `ablate_gdn.py` the GDN ablations of
H200 runs 7-8. `../device/run_h200.sh` runs them on the device machine."""
