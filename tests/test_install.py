"""The installed distribution exposes both import packages and the console script."""

import subprocess
import sys


def test_both_import_packages_and_cli_are_installed() -> None:
    import lumobench
    import lumotree

    assert lumobench.__version__ == lumotree.__version__
    out = subprocess.run(
        [sys.executable, "-m", "lumobench.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"lumobench {lumobench.__version__}"
