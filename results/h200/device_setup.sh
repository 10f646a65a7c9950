# Sourced by the run_kernels_v*.sh scripts on the device machine (repository root, OUT set): the
# carried wheels into /tmp/site (fla-core for the baseline; pydantic and its needs for lumobench),
# PYTHONPATH, and the card's state into $OUT/gpu.txt.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/fla_core-0.6.0-*.whl "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl \
    "$WHL"/annotated_types-0.8.0-*.whl "$WHL"/typing_inspection-0.4.5-*.whl \
    "$WHL"/typing_extensions-4.16.0-*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
