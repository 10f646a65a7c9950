"""The model folder's tokenizer and chat template, loaded without transformers.

`tokenizer.json` is read with HF `tokenizers`; the chat template comes from `tokenizer_config.json` and
is rendered in the same sandboxed Jinja environment transformers uses (`lumotree.model.chat_template`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer

from lumotree.model.chat_template import model_chat_template


class ChatTemplateError(ValueError):
    """The chat template could not render the given messages (a client mistake, reported as 400)."""


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table, which byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class ModelTokenizer:
    """Encoding, decoding and chat rendering for one model folder.

    Ids are Python ints in [0, vocab_size). Special tokens (`<|im_end|>` ...) are dropped by `decode`;
    markup tokens (`<think>`, `<tool_call>` ...) are ordinary text, as in Qwen's tokenizers.
    """

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        tok_file = self.model_dir / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file} not found: the model folder needs an HF tokenizer.json")
        self._tok = Tokenizer.from_file(str(tok_file))
        self._template: jinja2.Template | None = model_chat_template(self.model_dir)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        added = self._tok.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self._added = {i: t.content for i, t in added.items()}
        decoder = json.loads(tok_file.read_text()).get("decoder") or {}
        self._byte_level = decoder.get("type") == "ByteLevel"
        #: the most bytes one token stands for: a text of n characters is at least n / this many tokens
        self.max_token_bytes = max(
            (
                len(self.token_bytes(i))
                for i in range(self.vocab_size)
                if self._tok.id_to_token(i) is not None
            ),
            default=1,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their special ids.

        `encode_batch` because it releases the GIL while it works (`encode` holds it: a 10 MB prompt
        froze every other thread for 16 s); the ids are the same."""
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; an incomplete UTF-8 sequence decodes to U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The token on its own, as OpenAI logprobs show it (U+FFFD for a partial character)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes the token stands for (a byte-level token may be part of a character)."""
        if token_id in self._added:
            return self._added[token_id].encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is not in the vocabulary")
        if self._byte_level:
            table = _byte_decoder()
            return bytes(table[c] for c in piece)
        return self.token_text(token_id).encode()

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of a conversation; raises ChatTemplateError when the template refuses it."""
        if self._template is None:
            raise ChatTemplateError(f"the model at {self.model_dir} has no chat template")
        try:
            return self._template.render(
                **(template_kwargs or {}),
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
            )
        except (jinja2.TemplateError, TypeError) as exc:
            raise ChatTemplateError(f"the chat template cannot render these messages: {exc}") from None
