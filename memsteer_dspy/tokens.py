"""Token counting with a real tokenizer, offline.

Budgets (bundle size, answer-context budget) are counted in ``cl100k_base`` tokens with tiktoken.
tiktoken normally downloads its encoding files; LiteLLM (a DSPy dependency) ships them, so we
point tiktoken's cache at LiteLLM's copy and nothing is fetched at run time.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from functools import lru_cache
from pathlib import Path

ENCODING = "cl100k_base"
_lock = threading.Lock()


@lru_cache(maxsize=1)
def _encoding():
    with _lock:
        if "TIKTOKEN_CACHE_DIR" not in os.environ:
            spec = importlib.util.find_spec("litellm")  # locate without importing it
            if spec is not None and spec.origin:
                bundled = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
                os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)
        import tiktoken

        return tiktoken.get_encoding(ENCODING)


def count_tokens(text: str) -> int:
    """Number of ``cl100k_base`` tokens in ``text``."""
    if not text:
        return 0
    return len(_encoding().encode(text, disallowed_special=()))


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` that fits in ``max_tokens`` tokens."""
    if max_tokens <= 0:
        return ""
    enc = _encoding()
    ids = enc.encode(text, disallowed_special=())
    return text if len(ids) <= max_tokens else enc.decode(ids[:max_tokens])
