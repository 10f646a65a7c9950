"""Frozen manifests: which corpus records a replay uses, pinned by sha256 (DESIGN §6).

A manifest lists record ids with the sha256 of their canonical JSON, the corpus file's sha256, the
selection rule that chose the records, and when it was frozen. Replay refuses a corpus whose selected
records no longer match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from lumobench.corpus import CorpusRecord, file_sha256, record_sha256
from lumobench.errors import LumobenchError
from lumobench.results import write_text_atomic

MANIFEST_SCHEMA_VERSION = 1


class ManifestRecord(BaseModel):
    id: str
    sha256: str


class Selection(BaseModel):
    """How the records were chosen: `rule` names it ("all" = every record, in file order)."""

    rule: str = "all"
    params: dict[str, Any] = Field(default_factory=dict)


class Manifest(BaseModel):
    schema_version: int = MANIFEST_SCHEMA_VERSION
    corpus: str  # path as given when frozen (informational; matching uses hashes)
    corpus_sha256: str
    n_records: int
    records: list[ManifestRecord]
    selection: Selection = Field(default_factory=Selection)
    created: str

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.records]


@dataclass
class ManifestDiff:
    """How a corpus differs from a manifest, by record id."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the manifest, not in the corpus
    added: list[str] = field(default_factory=list)  # in the corpus, not selected by the manifest

    def mismatch(self, selection_rule: str) -> bool:
        """Selected records changed or vanished; for rule "all", new records also break the match."""
        return bool(self.changed or self.missing or (selection_rule == "all" and self.added))


class ManifestMismatch(LumobenchError):
    """The corpus no longer matches its frozen manifest."""

    def __init__(self, manifest_path: Path, diff: ManifestDiff) -> None:
        self.diff = diff
        parts = [
            f"{label} {', '.join(ids)}"
            for label, ids in (("changed:", diff.changed), ("missing:", diff.missing), ("added:", diff.added))
            if ids
        ]
        super().__init__(f"corpus does not match manifest {manifest_path}; " + "; ".join(parts))


def freeze_manifest(
    corpus_path: Path, records: Sequence[CorpusRecord], selection: Selection | None = None
) -> Manifest:
    """Freeze `records` (already selected, in replay order) of the corpus at `corpus_path`."""
    return Manifest(
        corpus=str(corpus_path),
        corpus_sha256=file_sha256(corpus_path),
        n_records=len(records),
        records=[ManifestRecord(id=r.id, sha256=record_sha256(r)) for r in records],
        selection=selection or Selection(),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def write_manifest(manifest: Manifest, out: Path) -> None:
    """Write the manifest file (atomically), creating its folder; a path that cannot be one is refused."""
    if out.is_dir():
        raise LumobenchError(
            f"cannot write manifest {out}: it is a directory (give a file name, e.g. {out}/NAME.json)"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, manifest.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        raise LumobenchError(f"cannot write manifest {out}: {exc.strerror or exc}") from None


def read_manifest(path: Path) -> Manifest:
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise LumobenchError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        raise LumobenchError(f"{path} is not a lumobench manifest: {exc.errors()[0]['msg']}") from None


def diff_manifest(manifest: Manifest, records: Sequence[CorpusRecord]) -> ManifestDiff:
    """Compare the corpus records against the manifest, record by record."""
    current = {r.id: record_sha256(r) for r in records}
    pinned = {r.id: r.sha256 for r in manifest.records}
    return ManifestDiff(
        changed=[i for i, h in pinned.items() if i in current and current[i] != h],
        missing=[i for i in pinned if i not in current],
        added=[i for i in current if i not in pinned],
    )


def select_by_manifest(
    manifest: Manifest, manifest_path: Path, records: Sequence[CorpusRecord]
) -> list[CorpusRecord]:
    """The manifest's records in manifest order; raises `ManifestMismatch` if the corpus drifted."""
    diff = diff_manifest(manifest, records)
    if diff.mismatch(manifest.selection.rule):
        raise ManifestMismatch(manifest_path, diff)
    by_id = {r.id: r for r in records}
    return [by_id[i] for i in manifest.ids]
