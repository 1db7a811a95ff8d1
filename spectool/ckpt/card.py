"""What a checkpoint folder says about how it was trained, beside config.json: the model card's
metadata (``base_model``), the chat template and the rope settings, read as evidence only.

Nothing here runs checkpoint code: the model card's front matter is read with ``yaml.safe_load``
and a chat template is rendered in Jinja's immutable sandbox on a fixed three-turn conversation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spectool.ckpt.jsonfile import read_json_object

MAX_CARD_BYTES = 1 << 20
MAX_TEMPLATE_BYTES = 1 << 20
# The conversation both templates render: two user turns around one assistant turn, then the
# generation prompt. What a drafter sees for "the same conversation".
SAMPLE_CONVERSATION = (
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Thanks"},
)


def card_base_models(folder: Path) -> tuple[str, ...]:
    """The ``base_model`` entries of the model card's YAML front matter (README.md); () when
    there is no card, no front matter or no such field."""
    path = folder / "README.md"
    if not path.is_file() or path.stat().st_size > MAX_CARD_BYTES:
        return ()
    text = path.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", text, flags=re.S)
    if not m:
        return ()
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return ()
    value = meta.get("base_model") if isinstance(meta, dict) else None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return ()
    return tuple(v.strip() for v in value if isinstance(v, str) and v.strip())


@dataclass(frozen=True)
class Rope:
    """Rope settings a config states: ``theta`` (None: not stated) and ``scaling`` (a
    normalised ``(type, factor)``, ``None`` for no scaling); ``stated``: whether the config
    names any rope setting at all (a config that names none is no evidence either way)."""

    theta: float | None
    scaling: tuple[str, float] | None
    stated: bool

    def describe(self) -> str:
        theta = "theta ?" if self.theta is None else f"theta {self.theta:g}"
        scaling = (
            "no rope_scaling" if self.scaling is None else f"{self.scaling[0]} x{self.scaling[1]:g}"
        )
        return f"{theta}, {scaling}"


def rope_of(config: dict[str, Any]) -> Rope:
    """Read transformers 4.x (``rope_theta`` + ``rope_scaling``) and 5.x (``rope_parameters``)."""
    params = config.get("rope_parameters")
    stated = any(k in config for k in ("rope_theta", "rope_scaling", "rope_parameters"))
    theta: Any = config.get("rope_theta")
    scaling_src: Any = config.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        scaling_src = params
    scaling = None
    if isinstance(scaling_src, dict):
        kind = scaling_src.get("rope_type", scaling_src.get("type", "default"))
        if isinstance(kind, str) and kind != "default":
            factor = scaling_src.get("factor", 1.0)
            scaling = (kind, float(factor) if isinstance(factor, int | float) else 1.0)
    numeric = isinstance(theta, int | float) and not isinstance(theta, bool)
    return Rope(float(theta) if numeric else None, scaling, stated)


def chat_template(folder: Path) -> str | None:
    """The chat template: ``chat_template.jinja`` or ``tokenizer_config.json``'s field."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file() and jinja.stat().st_size <= MAX_TEMPLATE_BYTES:
        return jinja.read_text(encoding="utf-8", errors="replace")
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    value = read_json_object(config_path).get("chat_template")
    if isinstance(value, list):  # [{"name": "default", "template": "..."}, ...]
        value = next(
            (
                t.get("template")
                for t in value
                if isinstance(t, dict) and t.get("name") == "default"
            ),
            None,
        )
    return value if isinstance(value, str) else None


def render_template(template: str, bos: str | None, eos: str | None) -> str | None:
    """The sample conversation rendered as transformers renders it; None when Jinja is not
    installed or the template fails on it (no evidence then)."""
    try:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"  # a fixed date: both sides alike
    try:
        return env.from_string(template).render(
            messages=[dict(m) for m in SAMPLE_CONVERSATION],
            add_generation_prompt=True,
            bos_token=bos or "",
            eos_token=eos or "",
        )
    except Exception:  # noqa: BLE001 - a template that fails here is no evidence
        return None


def special_sequence(text: str, specials: set[str]) -> tuple[str, ...]:
    """The special tokens of ``text`` in order (the ids a drafter sees around the words)."""
    if not specials:
        return ()
    alternation = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    return tuple(re.findall(alternation, text))
