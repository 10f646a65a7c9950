"""Recipe that trains the project's small hybrid model (lumo-tiny-coder) from the Python sources installed
on the machine it runs on: `python -m lumotree.training run --out DIR` (see `--help`)."""
