"""Text <-> token ids for a model directory, without importing transformers.

Contract:

- :class:`Tokenizer` reads ``tokenizer.json`` (HF ``tokenizers`` format, required) plus the optional
  ``tokenizer_config.json``, ``generation_config.json``, ``special_tokens_map.json`` and
  ``chat_template.jinja`` of a model directory. Missing or unreadable files raise
  :class:`TokenizerError` naming the directory and the files expected there.
- ``encode`` adds special tokens exactly as the ``tokenizer.json`` post-processor says, plus a BOS
  in front when ``tokenizer_config.json`` has ``add_bos_token: true`` and the post-processor did not
  add one. A prompt rendered by :meth:`Tokenizer.apply_chat_template` already carries its special
  tokens: encode it with ``add_special_tokens=False``.
- Chat templates are rendered like HF transformers renders them: a sandboxed jinja2 environment
  with ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``strftime_now``, a ``tojson`` that
  keeps non-ASCII text, and the special tokens (``bos_token``, ``eos_token``, ...) as variables.
  A model without a template gets :data:`CHATML_TEMPLATE`.
- :class:`StreamDecoder` turns ids into text deltas one token at a time; the concatenation of all
  deltas (including ``flush()``) equals ``decode(all_ids)``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

from ..errors import ConfigError, TokenizerError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The fallback chat template (ChatML) for models whose files carry none. With a vocabulary that
lacks ``<|im_start|>``/``<|im_end|>`` the markers are tokenized as plain text: usable, not ideal."""

KNOWN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
"""End-of-turn tokens used as ``eos_token_ids`` when the configs name none (first ones found)."""

EXPECTED_FILES = ("tokenizer.json (required)", "tokenizer_config.json", "generation_config.json")
_PENDING = "\ufffd"  # what a lossy decode yields for an incomplete UTF-8 sequence


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_content(value) -> str | None:
    """A special token as configs write it: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _as_id_list(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _chat_template(config: dict, directory: Path) -> str | None:
    """The template from ``chat_template.jinja``, ``tokenizer_config.json`` (a str or a named list)
    or ``chat_template.json``."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template") or _read_json(directory / "chat_template.json").get(
        "chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationBlocks(jinja2.ext.Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` (it marks assistant text for training
    masks): rendered as its plain body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile ``source`` in a sandbox configured like HF transformers' chat-template environment."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationBlocks])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _byte_level_symbols() -> dict[str, int]:
    """GPT-2's byte-level alphabet, symbol -> byte (printable bytes stand for themselves)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    table = {chr(b): b for b in keep}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


_UNBYTE = _byte_level_symbols()


class Tokenizer:
    """A model's tokenizer: encode, decode, chat template, special token ids."""

    def __init__(self, backend: tokenizers.Tokenizer, config: dict | None = None,
                 generation_config: dict | None = None, chat_template: str | None = None,
                 name: str = "<memory>"):
        self._tok = backend
        self._config = dict(config or {})
        self._generation = dict(generation_config or {})
        self.name = name
        self.chat_template = chat_template or CHATML_TEMPLATE
        self.has_chat_template = chat_template is not None
        try:
            self._template = compile_chat_template(self.chat_template)
        except jinja2.exceptions.TemplateError as e:
            raise TokenizerError(f"the chat template of {name} does not compile: {e}") from e
        self.bos_token = _token_content(self._config.get("bos_token"))
        self.eos_token = _token_content(self._config.get("eos_token"))
        self.bos_token_id = self._bos_id()
        self.eos_token_ids = self._eos_ids()

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load the tokenizer files of the model directory ``path``."""
        directory = Path(path).expanduser()
        tokenizer_file = directory / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(
                f"no tokenizer.json in {directory}; a model directory needs "
                f"{', '.join(EXPECTED_FILES)} (HF tokenizers format)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the Rust side raises a bare Exception for malformed files
            raise TokenizerError(f"cannot parse {tokenizer_file}: {e}") from e
        config = _read_json(directory / "special_tokens_map.json")
        config.update(_read_json(directory / "tokenizer_config.json"))
        generation = _read_json(directory / "generation_config.json")
        return cls(backend, config, generation, _chat_template(config, directory), str(directory))

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def _bos_id(self) -> int | None:
        from_config = self._id(self.bos_token)
        if from_config is not None:
            return from_config
        ids = _as_id_list(self._generation.get("bos_token_id"))
        return ids[0] if ids else None

    def _eos_ids(self) -> frozenset[int]:
        ids = set(_as_id_list(self._generation.get("eos_token_id")))
        if (eos := self._id(self.eos_token)) is not None:
            ids.add(eos)
        if not ids:
            known = [i for i in map(self._id, KNOWN_END_TOKENS) if i is not None]
            ids.update(known[:1])
        return frozenset(ids)

    @property
    def vocab_size(self) -> int:
        """Number of tokens including added (special) tokens, like ``len()`` of an HF tokenizer."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE token may be part of a character):
        its byte-level symbols mapped back to bytes, a byte-fallback ``<0xNN>``, else its
        decoded text (SentencePiece's ``▁`` a space)."""
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            return b""
        if type(self._tok.decoder).__name__ == "ByteLevel" and all(c in _UNBYTE for c in piece):
            return bytes(_UNBYTE[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        text = self._tok.decode([int(token_id)], skip_special_tokens=False)
        return (text if "\ufffd" not in text or not piece else piece.replace("\u2581", " ")).encode()

    def backend_json(self) -> str:
        """The HF ``tokenizers`` definition as a JSON string (what grammar engines read)."""
        return self._tok.to_str()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; see the module docstring for when a BOS is added."""
        if not isinstance(text, str):
            raise ConfigError(f"encode expects a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        if (add_special_tokens and self._config.get("add_bos_token") is True and bos is not None
                and ids[:1] != [bos]):
            ids = [bos, *ids]
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; incomplete UTF-8 byte sequences decode as U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) into the prompt text."""
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ConfigError("messages must be a list of dicts with 'role' and 'content', "
                              f"got {messages!r:.200}")
        variables = {k: _token_content(self._config.get(k))
                     for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        variables.update({"tools": None, "documents": None, **kwargs})  # HF passes these two
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **variables)
        except jinja2.exceptions.TemplateError as e:
            raise ConfigError(f"the chat template of {self.name} rejected the messages: {e}") from e


class StreamDecoder:
    """Incremental detokenizer: ``add(id)`` returns the text that became final with that token.

    Text is decoded over a short window of ids (the last emitted token(s) plus the pending ones), so
    each call costs O(window), and decoders that depend on context (leading-space rules) behave as
    in a full decode. A window whose text ends in U+FFFD is an incomplete UTF-8 / byte-level
    sequence: nothing is emitted until a later token completes it or :meth:`flush` is called.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: already-emitted context
        self._read = 0  # end of what has been emitted

    def _window_delta(self) -> tuple[str, str]:
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix:self._read], self._skip)
        return prefix_text, decode(self._ids[self._prefix:], self._skip)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (possibly "")."""
        self._ids.append(int(token_id))
        prefix_text, text = self._window_delta()
        if len(text) <= len(prefix_text) or text.endswith(_PENDING):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text):]

    def flush(self) -> str:
        """Emit whatever is still held back (an incomplete sequence decodes as U+FFFD)."""
        prefix_text, text = self._window_delta()
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):]

    def reset(self) -> None:
        self._ids.clear()
        self._prefix = self._read = 0

    @property
    def ids(self) -> list[int]:
        return list(self._ids)
