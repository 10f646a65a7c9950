"""A draft vocabulary: the token ids the MTP drafting passes may propose.

Each MTP pass ranks its hidden row against the vocabulary projection; at Qwen3.5-27B that streams
the whole 2.54 GB projection per pass, about 0.6 ms on an H200, five times per cycle. With a draft
vocabulary of the N most frequent tokens a pass streams N rows instead (0.34 GB for N = 32,768).
Verification still scores the whole vocabulary, so outputs are unchanged (the acceptance walk is
exact whatever was drafted); what changes is which drafts are proposed, so a token outside the
subset can only be accepted as the target's own choice after the drafts.

A draft vocabulary file is JSON, `{"format": "lumotree-draft-vocab/1", "vocab_size": V,
"token_ids": [...], "source": "..."}`, written by

    python -m lumotree.drafting.draft_vocab --model DIR --size N --out ids.json CORPUS...

which counts the model tokenizer's tokens over text files or JSONL files (every string value of
every record but its bookkeeping fields, METADATA_KEYS: message contents, tool arguments, and in a
lumobench replay's requests.jsonl the outputs the served model wrote, which are what its MTP head
should propose) and keeps the N most frequent ids plus the model's EOS ids. The ids are kept
sorted, so a ranking over the subset breaks ties towards the lower token id exactly as the ranking
over the whole vocabulary does.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.nn.functional as F
import typer
from torch import Tensor

FORMAT = "lumotree-draft-vocab/1"
# record fields that name or time things rather than hold text a model reads or writes
METADATA_KEYS = frozenset(
    {"id", "request_id", "status", "error", "started_at", "finish_reason", "role", "source", "tool_call_id"}
)


class DraftVocabError(ValueError):
    """A draft vocabulary file that cannot be used with this model."""


def check_ids(ids: Iterable[int], vocab_size: int, where: str = "draft vocabulary") -> Tensor:
    """Sorted int64 ids, every one in [0, vocab_size), at least one, no repeats."""
    values = list(ids)
    if not values:
        raise DraftVocabError(f"{where}: no token ids")
    if any(not isinstance(i, int) or isinstance(i, bool) for i in values):
        raise DraftVocabError(f"{where}: token ids must be integers")
    bad = [i for i in values if not 0 <= i < vocab_size]
    if bad:
        raise DraftVocabError(f"{where}: token id {bad[0]} outside the model's vocabulary of {vocab_size}")
    if len(set(values)) != len(values):
        raise DraftVocabError(f"{where}: token ids repeat")
    return torch.tensor(sorted(values), dtype=torch.int64)


def load_draft_vocab(path: Path | str, vocab_size: int) -> Tensor:
    """The sorted token ids [N] int64 of a draft vocabulary file, checked against `vocab_size`."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DraftVocabError(f"draft vocabulary {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftVocabError(f"draft vocabulary {path}: not a JSON file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("token_ids"), list):
        raise DraftVocabError(
            f"draft vocabulary {path}: expected {{'format': {FORMAT!r}, 'token_ids': [...]}}"
        )
    if doc.get("vocab_size") != vocab_size:
        raise DraftVocabError(
            f"draft vocabulary {path} was made for a vocabulary of {doc.get('vocab_size')}, "
            f"the model has {vocab_size}"
        )
    return check_ids(doc["token_ids"], vocab_size, f"draft vocabulary {path}")


def save_draft_vocab(path: Path | str, ids: Sequence[int], vocab_size: int, source: str) -> None:
    """Write a draft vocabulary file (ids checked and sorted)."""
    checked = check_ids(ids, vocab_size)
    doc = {"format": FORMAT, "vocab_size": vocab_size, "size": len(checked), "source": source,
           "token_ids": checked.tolist()}  # fmt: skip
    Path(path).write_text(json.dumps(doc) + "\n")


def most_frequent(counts: Counter[int], size: int, keep: Sequence[int] = ()) -> list[int]:
    """The `keep` ids and then the most frequent ids (ties: lower id first), `size` in all, sorted."""
    chosen = dict.fromkeys(keep)
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= size:
            break
        chosen.setdefault(token)
    return sorted(chosen)


def subset_head(weight: Tensor, ids: Tensor, dtype: torch.dtype | None = None) -> Callable[[Tensor], Tensor]:
    """A vocabulary projection over the whole vocabulary whose logits outside `ids` are -inf, for
    the CPU drafters (their rankings read whole-vocabulary rows). The projection itself reads the
    subset's rows only; dtype: the weight copy's precision (None: the weight's)."""
    rows = weight.detach().index_select(0, ids.to(weight.device)).to(dtype or weight.dtype).contiguous()
    index = ids.to(weight.device)
    vocab = weight.shape[0]

    def head(hidden: Tensor) -> Tensor:
        sub = F.linear(hidden.to(rows.dtype), rows).float()
        full = sub.new_full((*sub.shape[:-1], vocab), float("-inf"))
        return full.index_copy_(-1, index, sub)

    return head


def draft_head(weight: Tensor, dtype: str, draft_ids: Tensor | None) -> Callable[[Tensor], Tensor] | None:
    """The vocabulary projection of the CPU MTP passes (None: the model's own): a bfloat16 copy of
    `weight` (the model's lm_head weight), and/or its draft-vocabulary rows with -inf logits
    elsewhere (`subset_head`).

    Each MTP pass streams the whole projection (8 MB in fp32 for lumo-tiny-coder); on a CPU that is
    memory-bound, and half the bytes make the pass faster. Drafts only propose: verification uses
    the fp32 target, so outputs keep their distribution (a near-tie may pick another draft).
    """
    weight = weight.detach()
    half = torch.bfloat16 if dtype == "bfloat16" else None
    if draft_ids is not None:
        return subset_head(weight, draft_ids, half)
    if half is None:
        return None
    copy = weight.to(half)
    return lambda h: F.linear(h.to(half), copy).float()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in METADATA_KEYS:
                yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def corpus_texts(path: Path) -> Iterator[str]:
    """The texts of one input: every string of every record of a .jsonl file, else the whole file."""
    if path.suffix != ".jsonl":
        yield path.read_text()
        return
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield from _strings(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DraftVocabError(f"{path}:{number}: not a JSON line ({exc.msg})") from None


def main(
    corpus: Annotated[
        list[Path], typer.Argument(help="Text files or JSONL corpora whose token counts rank the vocabulary.")
    ],
    out: Annotated[Path, typer.Option(help="Where to write the draft vocabulary (JSON).")],
    size: Annotated[int, typer.Option(help="Token ids to keep.")] = 32768,
    model: Annotated[
        Path | None, typer.Option(help="Checkpoint folder with tokenizer.json (default: lumo-tiny-coder).")
    ] = None,
) -> None:
    """Count tokens over CORPUS with the model's tokenizer and write the SIZE most frequent ids (and
    the model's EOS ids) as a draft vocabulary for `--draft-vocab`."""
    from tokenizers import Tokenizer

    from lumotree.model import default_model_path
    from lumotree.model.checkpoint import model_eos_ids
    from lumotree.model.config import HybridConfig

    folder = model or default_model_path()
    try:
        if size < 1:
            raise DraftVocabError(f"--size must be >= 1, got {size}")
        config = HybridConfig.from_file(folder / "config.json")
        try:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a plain Exception for a missing or bad file
            raise DraftVocabError(f"{folder}: cannot load tokenizer.json ({exc})") from None
        counts: Counter[int] = Counter()
        for path in corpus:
            if not path.is_file():
                raise DraftVocabError(f"{path}: no such file")
            for text in corpus_texts(path):
                counts.update(tokenizer.encode(text, add_special_tokens=False).ids)
        keep = [i for i in model_eos_ids(folder, config.eos_token_id) if 0 <= i < config.vocab_size]
        ids = most_frequent(counts, min(size, config.vocab_size), keep)
        save_draft_vocab(out, ids, config.vocab_size, ", ".join(p.name for p in corpus))
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    seen = sum(counts[i] for i in ids)
    typer.echo(
        f"wrote {out}: {len(ids)} of {config.vocab_size} token ids, covering {seen} of "
        f"{sum(counts.values())} corpus tokens ({len(counts)} distinct)"
    )


if __name__ == "__main__":
    typer.run(main)
