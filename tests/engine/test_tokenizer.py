"""The engine's tokenizer wrapper on a tiny tokenizer and on the real Llama 3 / Qwen3 ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ckpt_factory import tokenizers_dir
from tokenizers import Tokenizer as HFTokenizer

from spectool.engine.tokenizer import Tokenizer
from spectool.errors import BadInputError, CheckpointError

from .helpers import BOS_ID, EOS_ID


def _real(tmp_path_factory: pytest.TempPathFactory, name: str) -> Tokenizer:
    folder = tmp_path_factory.mktemp(name)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizers_dir() / name / file, folder / file)
    return Tokenizer.from_dir(folder)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return _real(tmp_path_factory, "qwen3")


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return _real(tmp_path_factory, "llama3")


def test_tiny_tokenizer_round_trip(target_dir: Path) -> None:
    tok = Tokenizer.from_dir(target_dir)
    assert tok.encode("t5 t6 t63") == [5, 6, 63]
    assert tok.decode([5, 6, EOS_ID]) == "t5 t6"
    assert tok.decode([5, EOS_ID], skip_special_tokens=False) == "t5 <eos>"
    assert tok.eos_token_ids == (EOS_ID,)
    assert tok.bos_token_id == BOS_ID
    assert tok.vocab_size == 64


def test_plain_chat_fallback(llama3: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = llama3.apply_chat_template(messages)
    assert text == "system: Be brief.\nuser: Hi\nassistant: "
    ids = llama3.encode_chat(messages)
    assert ids[0] == 128000  # <|begin_of_text|>, added by the tokenizer's post-processor
    assert llama3.decode(ids) == text
    assert llama3.eos_token_ids == (128001,)  # <|end_of_text|> from tokenizer_config.json


def test_qwen3_chat_template(qwen3: Tokenizer) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    text = qwen3.apply_chat_template(messages)
    assert text.startswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    ids = qwen3.encode_chat(messages)
    assert ids[0] == qwen3.token_to_id("<|im_start|>") == 151644
    assert qwen3.bos_token_id is None
    assert qwen3.eos_token_ids == (151645,)  # <|im_end|>
    no_prompt = qwen3.apply_chat_template(messages, add_generation_prompt=False)
    assert no_prompt == "<|im_start|>user\nHello<|im_end|>\n"


def test_eos_ids_are_the_union_of_all_sources(tmp_path: Path, target_dir: Path) -> None:
    shutil.copytree(target_dir, tmp_path / "t")
    (tmp_path / "t" / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    config["eos_token_id"] = 9
    (tmp_path / "t" / "config.json").write_text(json.dumps(config))
    assert Tokenizer.from_dir(tmp_path / "t").eos_token_ids == (7, 9, EOS_ID)


def test_incremental_decoding_streams_whole_characters(llama3: Tokenizer) -> None:
    text = "Hello 👋🏽 世界, naïve café — ok"
    ids = llama3.encode(text, add_special_tokens=False)
    decoder = llama3.incremental_decoder()
    deltas = [decoder.push([token]) for token in ids]
    deltas.append(decoder.flush())
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas[:-1]  # some ids were only part of a character and were held back
    assert len([d for d in deltas if d]) > 5


def test_incremental_decoding_in_chunks(qwen3: Tokenizer) -> None:
    text = "def f(x):\n    return x ** 2  # 平方"
    ids = qwen3.encode(text)
    decoder = qwen3.incremental_decoder()
    out = "".join(decoder.push(ids[i : i + 3]) for i in range(0, len(ids), 3)) + decoder.flush()
    assert out == text


def _templated(template: str) -> Tokenizer:
    from tokenizers import models

    return Tokenizer(HFTokenizer(models.WordLevel({"a": 0}, unk_token="a")), chat_template=template)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% set x = messages.append({'role': 'x'}) %}{{ messages }}",
        "{{ raise_exception('only user messages') }}",
    ],
)
def test_chat_template_runs_sandboxed(template: str) -> None:
    with pytest.raises(BadInputError, match="chat template refused"):
        _templated(template).apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_sources(tmp_path: Path, target_dir: Path) -> None:
    folder = tmp_path / "t"
    shutil.copytree(target_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{% for m in messages %}[{{ m.content }}]{% endfor %}"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "t5"}]
    assert Tokenizer.from_dir(folder).apply_chat_template(messages) == "[t5]"
    (folder / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0].content }}")
    assert Tokenizer.from_dir(folder).apply_chat_template(messages) == "<bos>t5"
    (folder / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(CheckpointError, match="does not parse"):
        Tokenizer.from_dir(folder)


def test_broken_tokenizer_files(tmp_path: Path, target_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    folder = tmp_path / "t"
    shutil.copytree(target_dir, folder)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        Tokenizer.from_dir(folder)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="not a readable tokenizer"):
        Tokenizer.from_dir(folder)
