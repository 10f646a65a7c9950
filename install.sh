#!/usr/bin/env bash
# Install lumobench + LumoTree into ./.venv (idempotent; a second run only checks).
#
# CPU-only machines get the CPU build of PyTorch (torch==2.13.0+cpu): from the local wheelhouse when pip
# is configured with one, else from PyTorch's CPU index. An unpinned `torch` would pull a multi-GB
# CUDA build. On a machine with an NVIDIA GPU the existing CUDA torch is kept (or PyPI's default
# CUDA build is installed).
#
#   ./install.sh            runtime + test dependencies (pytest, transformers, triton, ...)
#   ./install.sh --runtime  runtime dependencies only
#   PYTHON=python3.12 ./install.sh   choose the interpreter (>= 3.11)
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=${LUMO_VENV:-.venv}
CPU_TORCH=${LUMO_CPU_TORCH:-torch==2.13.0+cpu}
extras="[dev]"
[[ "${1:-}" == "--runtime" ]] && extras=""

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "install.sh: creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    if has_gpu; then
        echo "install.sh: NVIDIA GPU found: installing the CUDA build of torch from PyPI"
        "${pip[@]}" install -q "torch>=2.11"
    else
        echo "install.sh: no GPU: installing the CPU build $CPU_TORCH"
        # The +cpu local version exists only as a CPU wheel: a configured wheelhouse (as on our CI
        # machines) serves it directly; elsewhere PyPI has no +cpu build and PyTorch's CPU index does.
        "${pip[@]}" install -q "$CPU_TORCH" 2>/dev/null \
            || "${pip[@]}" install -q "$CPU_TORCH" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
fi

# (the grep hides this machine's harmless "Location ... is ignored" wheelhouse warnings)
"${pip[@]}" install -q -e ".$extras" 2> >(grep -v "is ignored: it is neither" >&2)
"$VENV/bin/python" -c "import lumobench, lumotree, torch; print('install.sh: ok: lumobench', lumobench.__version__, '| torch', torch.__version__)"
