"""API keys as SHA-256 hashes: what the server stores, compares and names keys by."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
KEY_ID_PREFIX = "key-"
KEY_ID_HEX_CHARS = 16  # of the hash: 64 bits, unique enough to name a key, useless to guess it


def hash_key(key: str) -> str:
    """The lowercase hex SHA-256 of a key's UTF-8 bytes (`echo -n KEY | sha256sum`)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_sha256(value: str) -> bool:
    """Whether `value` is a lowercase hex SHA-256 digest."""
    return bool(_SHA256_HEX.fullmatch(value))


def key_id(key_hash: str) -> str:
    """The public name of a key: a prefix of its hash (`key-0123456789abcdef`)."""
    return KEY_ID_PREFIX + key_hash[:KEY_ID_HEX_CHARS]


def generate_key() -> str:
    """A new random API key (`sk-` and 43 URL-safe characters, 256 bits)."""
    return "sk-" + secrets.token_urlsafe(32)


def same_hash(a: str, b: str) -> bool:
    """Constant-time comparison of two hex digests."""
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))
