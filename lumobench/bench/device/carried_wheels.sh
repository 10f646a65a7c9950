# Sourced by the device scripts (the H200 machine has no network): install the carried wheels of
# the harness and server dependencies its image lacks into /tmp/site, and put them, the repository
# and serving/ on PYTHONPATH. WHL names the wheel folder (default .whl).
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl "$WHL"/annotated_types-0.8.0-*.whl \
    "$WHL"/typing_inspection-0.4.5-*.whl "$WHL"/typing_extensions-4.16.0-*.whl \
    "$WHL"/fastapi-0.165.0-*.whl "$WHL"/starlette-1.10.0-*.whl "$WHL"/uvicorn-0.54.0-*.whl \
    "$WHL"/opentelemetry_api-1.45.2-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
