"""The HTTP edge: CORS for browser clients and TLS, with vLLM's flag names.

Config file sections (every key optional)::

    cors: {allowed_origins: ["https://app.example.com"], allowed_methods: ["*"],
           allowed_headers: ["*"], allow_credentials: false}
    tls:  {ssl_keyfile: key.pem, ssl_certfile: cert.pem, ssl_ca_certs: null, ssl_cert_reqs: 0}

`cors.*` lists take a list or a JSON list (`--allowed-origins '["https://a.example"]'`, as
vLLM's flags). TLS files are read when the config is built, so a missing, unreadable or
mismatched file stops the start with its name before any model loads.
"""

from __future__ import annotations

import argparse
import json
import ssl
from dataclasses import dataclass
from typing import Any, NoReturn

CERT_REQS = {0: "none", 1: "optional", 2: "required"}  # ssl.CERT_NONE/OPTIONAL/REQUIRED

# flag dest -> config key, for gateway/__main__.py
OVERRIDES = {
    "allowed_origins": "cors.allowed_origins", "allowed_methods": "cors.allowed_methods",
    "allowed_headers": "cors.allowed_headers", "allow_credentials": "cors.allow_credentials",
    "ssl_keyfile": "tls.ssl_keyfile", "ssl_certfile": "tls.ssl_certfile",
    "ssl_ca_certs": "tls.ssl_ca_certs", "ssl_cert_reqs": "tls.ssl_cert_reqs",
}


class TransportError(ValueError):
    """An invalid CORS or TLS setting; the message names the key (a ConfigError's base)."""


def _fail(key: str, problem: str) -> NoReturn:
    raise TransportError(f"{key}: {problem}")


def _string_list(value: Any, key: str) -> tuple[str, ...]:
    """A list of strings, or its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            _fail(key, f"expected a JSON list of strings, e.g. '[\"*\"]', got {value!r}")
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        _fail(key, f"expected a list of non-empty strings, got {value!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class CorsSettings:
    """Which browser origins may call the API (Starlette's CORSMiddleware).

    NOTE: no origins by default, so no CORS headers and browsers keep other sites' pages
    from calling the API with a user's credentials. vLLM's default allows every origin
    (`["*"]`); `--allowed-origins '["*"]'` gives that."""

    allowed_origins: Any = ()  # () = CORS off
    allowed_methods: Any = ("*",)
    allowed_headers: Any = ("*",)
    allow_credentials: bool = False  # cookies / Authorization on cross-origin requests

    def __post_init__(self) -> None:
        for key in ("allowed_origins", "allowed_methods", "allowed_headers"):
            object.__setattr__(self, key, _string_list(getattr(self, key), f"cors.{key}"))
        if not isinstance(self.allow_credentials, bool):
            _fail("cors.allow_credentials", "true or false")

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_origins)

    def middleware_options(self) -> dict[str, Any]:
        """Starlette CORSMiddleware's keyword arguments."""
        return {"allow_origins": self.allowed_origins, "allow_methods": self.allowed_methods,
                "allow_headers": self.allowed_headers,
                "allow_credentials": self.allow_credentials}


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """HTTPS for the listener (uvicorn's ssl_* options); off without a key and certificate."""

    ssl_keyfile: str | None = None  # PEM private key (unencrypted)
    ssl_certfile: str | None = None  # PEM certificate chain
    ssl_ca_certs: str | None = None  # PEM CAs that client certificates are checked against
    ssl_cert_reqs: int = 0  # client certificates: 0 none, 1 optional, 2 required (mutual TLS)

    def __post_init__(self) -> None:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            _fail("tls.ssl_keyfile" if self.ssl_keyfile is None else "tls.ssl_certfile",
                  "HTTPS needs both --ssl-keyfile and --ssl-certfile")
        if self.ssl_cert_reqs not in CERT_REQS or isinstance(self.ssl_cert_reqs, bool):
            _fail("tls.ssl_cert_reqs", f"0 (none), 1 (optional) or 2 (required), got "
                                       f"{self.ssl_cert_reqs!r}")
        if not self.enabled and (self.ssl_ca_certs is not None or self.ssl_cert_reqs):
            _fail("tls.ssl_ca_certs", "client certificates need HTTPS (--ssl-keyfile and "
                                      "--ssl-certfile)")
        if self.ssl_cert_reqs and self.ssl_ca_certs is None:
            _fail("tls.ssl_ca_certs", "checking client certificates needs --ssl-ca-certs")
        if self.enabled:
            self.server_context()  # every file read now: a bad one fails the start

    @property
    def enabled(self) -> bool:
        return self.ssl_keyfile is not None

    def server_context(self) -> ssl.SSLContext:
        """The listener's context; TransportError naming the file that cannot be used."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        assert self.ssl_certfile is not None and self.ssl_keyfile is not None
        for key, path in (("tls.ssl_certfile", self.ssl_certfile),
                          ("tls.ssl_keyfile", self.ssl_keyfile),
                          ("tls.ssl_ca_certs", self.ssl_ca_certs)):
            if path is not None:
                _readable(key, path)
        try:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=_no_password)
        except (ssl.SSLError, OSError, _EncryptedKey) as exc:
            _fail("tls.ssl_certfile", f"cannot use {self.ssl_certfile} with key "
                                      f"{self.ssl_keyfile}: {exc}")
        if self.ssl_ca_certs is not None:
            try:
                context.load_verify_locations(self.ssl_ca_certs)
            except (ssl.SSLError, OSError) as exc:
                _fail("tls.ssl_ca_certs", f"cannot read CA certificates from "
                                          f"{self.ssl_ca_certs}: {exc}")
        return context

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's keyword arguments for these settings (none when TLS is off)."""
        if not self.enabled:
            return {}
        return {"ssl_keyfile": self.ssl_keyfile, "ssl_certfile": self.ssl_certfile,
                "ssl_ca_certs": self.ssl_ca_certs, "ssl_cert_reqs": self.ssl_cert_reqs}


class _EncryptedKey(Exception):
    def __str__(self) -> str:
        return "the key is encrypted; give an unencrypted key (as vLLM takes)"


def _no_password() -> bytes:
    raise _EncryptedKey


def _readable(key: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        _fail(key, f"cannot read {path}: {exc.strerror or exc}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The CORS and TLS flags of `serve` (vLLM's names)."""
    parser.add_argument("--allowed-origins", metavar="JSON",
                        help="origins browsers may call from, a JSON list, e.g. "
                             "'[\"https://app.example.com\"]' (default: none, no CORS headers; "
                             "vLLM's is '[\"*\"]')")
    parser.add_argument("--allowed-methods", metavar="JSON",
                        help="CORS methods, a JSON list (default '[\"*\"]')")
    parser.add_argument("--allowed-headers", metavar="JSON",
                        help="CORS request headers, a JSON list (default '[\"*\"]')")
    parser.add_argument("--allow-credentials", action="store_true", default=None,
                        help="CORS: allow credentials (cookies, Authorization)")
    parser.add_argument("--ssl-keyfile", help="HTTPS: the PEM private key")
    parser.add_argument("--ssl-certfile", help="HTTPS: the PEM certificate chain")
    parser.add_argument("--ssl-ca-certs", help="HTTPS: PEM CAs client certificates are "
                                               "checked against")
    parser.add_argument("--ssl-cert-reqs", type=int, choices=sorted(CERT_REQS),
                        help="client certificates: 0 none (default), 1 optional, 2 required")
