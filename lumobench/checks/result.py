"""Results of the component checks and their paper-style table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.table import Table


@dataclass
class CheckResult:
    """One row of the table: a check passes when every case passed and every planted fault was caught."""

    check: str
    cases: int = 0
    passed: int = 0
    faults_planted: int = 0
    faults_detected: int = 0
    detail: str = ""
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.skipped) or (
            self.passed == self.cases and self.faults_detected == self.faults_planted
        )

    def case(self, passed: bool) -> None:
        """Count one case."""
        self.cases += 1
        self.passed += int(passed)

    def fault(self, detected: bool) -> None:
        """Count one planted fault."""
        self.faults_planted += 1
        self.faults_detected += int(detected)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "ok": self.ok}


def render_table(results: Sequence[CheckResult], console: Console) -> None:
    """Print check | cases | passed | faults planted | faults detected | result, then each check's notes."""
    table = Table(title="LumoTree component checks")
    table.add_column("check", no_wrap=True)
    for col in ("cases", "passed", "faults\nplanted", "faults\ndetected"):
        table.add_column(col, justify="right")
    table.add_column("result")
    for r in results:
        verdict = "skipped" if r.skipped else ("ok" if r.ok else "[red]FAIL[/red]")
        table.add_row(
            r.check, str(r.cases), str(r.passed), str(r.faults_planted), str(r.faults_detected), verdict
        )
    console.print(table)
    for r in results:
        console.print(f"  [bold]{r.check}[/bold]: {r.skipped or r.detail}", highlight=False)
