"""Identifiers a new run and session get, and the readable names a run gets when none is given."""

from __future__ import annotations

import os
import time

__all__ = ["default_name", "new_run_id", "new_session_id"]

_ADJECTIVES = [
    "amber",
    "brave",
    "calm",
    "daring",
    "eager",
    "fleet",
    "gentle",
    "hardy",
    "keen",
    "lively",
    "mellow",
    "nimble",
    "proud",
    "quiet",
    "rapid",
    "steady",
    "swift",
    "tidy",
    "vivid",
    "witty",
]
_NOUNS = [
    "otter",
    "falcon",
    "heron",
    "lynx",
    "marten",
    "osprey",
    "panda",
    "puffin",
    "raven",
    "robin",
    "salmon",
    "swift",
    "tern",
    "tiger",
    "vole",
    "wren",
    "yak",
    "zebra",
    "badger",
    "bison",
]


def new_run_id() -> str:
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "".join(alphabet[b % 36] for b in os.urandom(8))


def new_session_id() -> str:
    return f"{int(time.time() * 1000):012x}{os.urandom(4).hex()}"


def default_name() -> str:
    a, n, k = os.urandom(3)
    return f"{_ADJECTIVES[a % len(_ADJECTIVES)]}-{_NOUNS[n % len(_NOUNS)]}-{k % 100}"
