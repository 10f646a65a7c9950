"""`lumobench bench gdn-variants`: a git revision's GDN scan modules staged as a package of their own
(imports pointed at the copies) run the kernels of that revision; bad arguments are refused. The
timing itself needs a GPU (results/h200/gdn-variants.md)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from lumobench.bench import gdn_variants
from lumobench.checks import gdn_checks
from lumobench.checks.random_trees import random_tree
from lumotree.verify import device_ops
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.paths_scan import gdn_paths_

from .helpers import poisoned


@pytest.fixture
def staged(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] == gdn_variants.PACKAGE]:
        del sys.modules[name]
    if str(tmp_path.resolve()) in sys.path:
        sys.path.remove(str(tmp_path.resolve()))


def test_a_staged_revision_runs_its_own_copies_of_the_kernels(staged: Path) -> None:
    commit = gdn_variants.resolve("HEAD")
    gdn_variants.stage_variant("head", commit, gdn_variants.revision_source(commit), staged)
    assert (staged / gdn_variants.PACKAGE / "head" / "REVISION").read_text().strip() == commit
    modules = gdn_variants.load_variant("head", staged)
    paths = modules["paths_scan"]
    assert paths.gdn_paths_.__module__ == "gdn_variants.head.paths_scan"  # type: ignore[attr-defined]
    assert paths.row_strided.__module__ == "gdn_variants.head.row_scan"  # type: ignore[attr-defined]
    assert paths._advance.fn.__module__ == "gdn_variants.head.scan"  # type: ignore[attr-defined]
    # the staged paths scan gives the product's bits (HEAD's modules are the ones under test here)
    tree = random_tree("paper", random.Random(2))
    dims = gdn_checks.GdnDims(H=1, HV=2, K=16, V=16)
    x, state = gdn_checks.make_case(tree, dims, torch.Generator().manual_seed(2)).inputs(torch.float32)
    tables = DeviceTree(tree.rows, tree.max_depth, "cpu").load_(tree).gdn
    outs = []
    for run in (gdn_paths_, paths.gdn_paths_):  # type: ignore[attr-defined]
        o = poisoned(tuple(x.v.shape), torch.float32)
        ops = empty_operands(tree.rows, dims.H, dims.HV, dims.K, dims.V, torch.device("cpu"))
        run(x, state, tables, o, ops)
        outs.append(o[: tree.n_active])
    assert not outs[1].isnan().any()
    assert torch.equal(outs[0], outs[1])


def test_the_table_has_a_row_a_run_and_a_column_a_register_cap() -> None:
    run = {"tree_rows_ms": 3.4, "chain_paths_ms": 0.49, "one_row_ms": 0.19, "publication_ms": 0.11}
    doc = {
        "variants": {"old": "83d4742", "new": "2526c07"},
        "device": "GPU",
        "command": "lumobench bench gdn-variants time old,new",
        "commit": "abc",
        "layers": 48,
        "iters": 50,
        "tree_rows": 28,
        "register_caps": [0, 128],
        "runs": [
            run
            | {"variant": "old", "round": 0, "tree_paths_ms": {"0": 1.468, "128": 1.393}}
            | {"paths_equal_rows": True},
            run
            | {"variant": "new", "round": 1, "tree_paths_ms": {"0": 1.882, "128": 1.840}}
            | {"tree_engine_ms": 1.118, "one_row_engine_ms": 0.181},
        ],
    }
    table = gdn_variants.markdown(doc)
    assert "| revision | round | paths, no cap | paths, 128 cap | tree, rows |" in table
    assert "| old | 0 | 1.468 | 1.393 | 3.400 | 0.490 | 0.190 | 0.110 | True | – | – |" in table
    assert "| new | 1 | 1.882 | 1.840 | 3.400 | 0.490 | 0.190 | 0.110 |  | 1.118 | 0.181 |" in table
    assert "old = 83d4742, new = 2526c07" in table and "Every GDN layer (48)" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stage", "Bad=HEAD"], "is not NAME=REVISION"),
        (["stage", "old"], "is not NAME=REVISION"),
        (["stage", "old=no-such-revision"], "git knows no commit"),
        (["time", "never_staged", "--out", "unused"], "no staged variant 'never_staged'"),
        (["launch", "never_staged"], "no staged variant 'never_staged'"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(gdn_variants.gdn_variants_app, args)
    assert result.exit_code == 2
    assert message in result.output


def test_a_staged_revisions_scans_stand_in_for_the_products_and_are_put_back(staged: Path) -> None:
    # A revision with prepared scans lends all four entry points; one without them (here: its
    # modules with the prepared entry points hidden) lends the raw two and keeps the product's.
    commit = gdn_variants.resolve("HEAD")
    gdn_variants.stage_variant("head", commit, gdn_variants.revision_source(commit), staged)
    modules = gdn_variants.load_variant("head", staged)
    product = {f: getattr(device_ops, f) for f in gdn_variants.SCAN_ENTRY_POINTS}
    with gdn_variants.scans_of(modules) as prepared:
        assert prepared
        for f, module in gdn_variants.SCAN_ENTRY_POINTS.items():
            assert getattr(device_ops, f) is getattr(modules[module], f), f
    assert {f: getattr(device_ops, f) for f in product} == product

    older = {name: SimpleNamespace(**{k: v for k, v in vars(m).items() if "prepared" not in k})
             for name, m in modules.items()}  # fmt: skip
    with gdn_variants.scans_of(older) as prepared:
        assert not prepared
        assert device_ops.gdn_rows_ is modules["row_scan"].gdn_rows_  # type: ignore[attr-defined]
        assert device_ops.gdn_paths_prepared_ is product["gdn_paths_prepared_"]
    assert {f: getattr(device_ops, f) for f in product} == product
