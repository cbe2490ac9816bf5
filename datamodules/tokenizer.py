"""Tokenizers with fixed special-token ids, trained once per corpus and cached on disk.

``kind: bpe`` is a byte-level BPE (GPT-2 style): text is mapped to its UTF-8 bytes, each shown as one of
256 printable characters, and merges are learned on top. It never needs [UNK], keeps whitespace and
newlines (so it round-trips code as well as prose) and decodes back to the original text.
``kind: byte`` is the same pipeline without merges: 5 special tokens + 256 bytes, nothing to train.

Special tokens have fixed ids in every tokenizer ([PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4), so
models and collate functions can rely on them; ids >= ``NUM_SPECIAL`` are ordinary tokens. Literal
"[MASK]" etc. inside a text are tokenized as text (``encode_special_tokens``), never as specials.

A trained tokenizer is cached at ``<cache_dir>/tokenizers/<key>.json`` with key = hash(fingerprint of
the training texts, kind, vocab_size, min_frequency): same texts and settings reuse the file, a change of
either trains a new one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from datamodules.cache import cache_key, fingerprint, write_cache
from foundation.checked import read_cache
from foundation.errors import ConfigError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
NUM_SPECIAL = len(SPECIAL_TOKENS)
_BYTE_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 characters standing for the bytes


def build_tokenizer(tok_cfg, texts: Sequence[str], cache_dir: str | Path) -> Tokenizer:
    """The tokenizer for ``tok_cfg`` (``data.tokenizer``): loaded from ``path``, the fixed byte vocabulary,
    or a BPE trained on ``texts`` (a sequence that can be iterated twice) and cached under ``cache_dir``."""
    if tok_cfg.path:
        tok = _load_given(tok_cfg.path)
    elif tok_cfg.kind == "byte":
        tok = _pipeline(models.BPE(vocab=_byte_vocab(), merges=[], unk_token="[UNK]"), use_regex=False)
    else:
        path = bpe_cache_path(tok_cfg, texts, cache_dir)
        tok = read_cache(path, lambda p: Tokenizer.from_file(str(p)))
        if tok is None:
            tok = _train_bpe(tok_cfg, texts)
            data = tok.to_str().encode("utf-8")
            write_cache(cache_dir, path, lambda f: f.write(data), len(data))
    tok.encode_special_tokens = True
    return tok


def bpe_cache_path(tok_cfg, texts: Sequence[str], cache_dir: str | Path) -> Path:
    """Where the BPE trained with ``tok_cfg`` on ``texts`` is cached."""
    key = cache_key("bpe", fingerprint(texts), tok_cfg.vocab_size, tok_cfg.min_frequency)
    return Path(cache_dir) / "tokenizers" / f"{key}.json"


def _pipeline(model: models.Model, use_regex: bool = True) -> Tokenizer:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _byte_vocab() -> dict[str, int]:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({char: NUM_SPECIAL + i for i, char in enumerate(_BYTE_ALPHABET)})
    return vocab


def _train_bpe(tok_cfg, texts: Sequence[str]) -> Tokenizer:
    minimum = NUM_SPECIAL + len(_BYTE_ALPHABET)
    if tok_cfg.vocab_size < minimum:
        raise ConfigError(
            f"data.tokenizer.vocab_size: must be >= {minimum} for byte-level BPE "
            f"(256 bytes + {NUM_SPECIAL} special tokens), got {tok_cfg.vocab_size}"
        )
    tok = _pipeline(models.BPE(unk_token="[UNK]"))
    trainer = trainers.BpeTrainer(
        vocab_size=tok_cfg.vocab_size,
        min_frequency=tok_cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=_BYTE_ALPHABET,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def _load_given(path: str) -> Tokenizer:
    if not Path(path).is_file():
        what = "is a folder, not a tokenizer.json file" if Path(path).is_dir() else "not found"
        raise ConfigError(f"data.tokenizer.path: {path!r} {what}")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as err:  # tokenizers raises a bare Exception for malformed JSON
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"data.tokenizer.path: {path!r} is not a tokenizer.json ({reason})") from err
    if [tok.token_to_id(t) for t in SPECIAL_TOKENS] != list(range(NUM_SPECIAL)):
        expected = ", ".join(f"{t}={i}" for i, t in enumerate(SPECIAL_TOKENS))
        raise ConfigError(f"data.tokenizer.path: {path!r} must define the special tokens {expected}")
    return tok
