"""Text <-> token ids for a checkpoint folder: ``tokenizers.Tokenizer`` plus tokenizer_config.json.

Adds what serving needs on top of ``tokenizer.json``: the end-of-sequence ids a request stops on
(union of generation_config.json, config.json and tokenizer_config.json), BOS handling, a chat
template rendered in Jinja's immutable sandbox (never ``trust_remote_code``), and an incremental
decoder that streams text without splitting multi-byte characters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer

from spectool.ckpt.jsonfile import read_json_object
from spectool.constants import MAX_TOKENIZER_BYTES
from spectool.errors import BadInputError, CheckpointError

Message = Mapping[str, Any]


def _read_optional_json(path: Path) -> dict[str, Any]:
    return read_json_object(path) if path.is_file() else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def plain_chat_text(messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
    """A conversation as a checkpoint without a chat template gets it: ``"role: content\\n"`` per
    message and ``"assistant: "`` to prompt the reply (also what workload files use to count a
    chat request's tokens when no target tokenizer is at hand)."""
    text = "".join(f"{m.get('role', '')}: {m.get('content', '')}\n" for m in messages)
    return text + ("assistant: " if add_generation_prompt else "")


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas for streaming.

    Decodes a short window of recent ids twice (without and with the newest ids) and emits the
    difference, holding text back while it ends in an incomplete UTF-8 sequence (U+FFFD), the
    same scheme as vLLM's ``detokenize_incrementally``.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids: Iterable[int]) -> str:
        """Add ids; return the text they complete (possibly ``""``)."""
        self._ids.extend(int(t) for t in token_ids)
        prefix = self._tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=self._skip
        )
        full = self._tokenizer.decode(
            self._ids[self._prefix_offset :], skip_special_tokens=self._skip
        )
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Text still held back (an incomplete character is emitted as U+FFFD)."""
        prefix = self._tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=self._skip
        )
        full = self._tokenizer.decode(
            self._ids[self._prefix_offset :], skip_special_tokens=self._skip
        )
        self._prefix_offset = self._read_offset = len(self._ids)
        return full[len(prefix) :] if full.startswith(prefix) else ""


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode, chat template, special ids.

    ``eos_token_ids`` are every id that ends a request; ``bos_token_id`` is None when the model
    has none. Build with :meth:`from_dir`.
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        eos_token_ids: Sequence[int] = (),
        bos_token_id: int | None = None,
        add_bos_token: bool | None = None,
        chat_template: str | None = None,
        where: str | Path | None = None,
    ) -> None:
        self._tok = tokenizer
        self.where = str(where) if where is not None else None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None
        if chat_template is not None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            try:
                self._template = env.from_string(chat_template)
            except jinja2.exceptions.TemplateError as e:
                raise CheckpointError(where, f"chat_template does not parse: {e}") from e

    @classmethod
    def from_dir(cls, folder: Path) -> Tokenizer:
        """Load ``tokenizer.json`` and the optional JSON files beside it in ``folder``."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(folder, "has no tokenizer.json")
        if path.stat().st_size > MAX_TOKENIZER_BYTES:
            raise CheckpointError(path, f"larger than the {MAX_TOKENIZER_BYTES} bytes allowed")
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(path, f"not a readable tokenizer: {e}") from e
        tok_config = _read_optional_json(folder / "tokenizer_config.json")
        gen_config = _read_optional_json(folder / "generation_config.json")
        model_config = _read_optional_json(folder / "config.json")
        bos_token = _token_text(tok_config.get("bos_token"))
        eos_token = _token_text(tok_config.get("eos_token"))
        eos_ids = _ids(gen_config.get("eos_token_id")) + _ids(model_config.get("eos_token_id"))
        if eos_token is not None and tok.token_to_id(eos_token) is not None:
            eos_ids.append(int(tok.token_to_id(eos_token)))
        bos_id = tok.token_to_id(bos_token) if bos_token is not None else None
        if bos_id is None:
            bos_ids = _ids(gen_config.get("bos_token_id")) or _ids(model_config.get("bos_token_id"))
            bos_id = bos_ids[0] if bos_ids else None
        add_bos = tok_config.get("add_bos_token")
        return cls(
            tok,
            bos_token=bos_token,
            eos_token=eos_token,
            eos_token_ids=eos_ids,
            bos_token_id=bos_id,
            add_bos_token=add_bos if isinstance(add_bos, bool) else None,
            chat_template=_chat_template(folder, tok_config),
            where=folder,
        )

    @property
    def vocab_size(self) -> int:
        """Entries including added tokens (may be below a model's padded ``vocab_size``)."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tok.get_vocab(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the BOS the model expects is there."""
        ids = list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        if (
            add_special_tokens
            and self.add_bos_token
            and self.bos_token_id is not None
            and (not ids or ids[0] != self.bos_token_id)
        ):
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def incremental_decoder(self, *, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for a conversation.

        With a ``chat_template`` it is rendered in Jinja's immutable sandbox with ``messages``,
        ``add_generation_prompt``, ``bos_token`` and ``eos_token``; without one, a plain
        ``"role: content\\n"`` per message and ``"assistant: "`` to prompt the reply.
        """
        if self._template is None:
            return plain_chat_text(messages, add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                tools=None,
            )
        except (jinja2.exceptions.TemplateError, TypeError, ValueError) as e:
            raise BadInputError("messages", f"chat template refused them: {e}") from e

    def encode_chat(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of :meth:`apply_chat_template`'s text.

        A template writes its own BOS, so special tokens are not added again; the plain fallback
        gets the usual BOS.
        """
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=self._template is None)
