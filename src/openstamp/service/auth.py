"""Bearer API keys: read from a file or an environment variable, kept only as sha256 digests,
compared in constant time.

A key file has one key per line; blank lines and ``#`` comments are skipped, and a line
``sha256:<hex>`` gives a key by its digest, so the file need not hold the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

ENV_VAR = "OPENSTAMP_API_KEYS"
MIN_KEY_CHARS = 16
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class ApiKeys:
    """A set of accepted keys, as digests. ``ApiKeys.check(token)`` is constant-time per key."""

    def __init__(self, digests: list[bytes]) -> None:
        if not digests:
            raise ValueError("no API keys given: the service would accept nobody")
        self._digests = list(digests)

    def __len__(self) -> int:
        return len(self._digests)

    @classmethod
    def from_lines(cls, lines: list[str], where: str) -> ApiKeys:
        digests = []
        for n, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("sha256:"):
                try:
                    digest = bytes.fromhex(line.removeprefix("sha256:"))
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise ValueError(f"{where} line {n}: sha256: must be followed by 64 hex digits")
                digests.append(digest)
                continue
            if len(line) < MIN_KEY_CHARS or any(c.isspace() for c in line):
                raise ValueError(
                    f"{where} line {n}: an API key needs at least {MIN_KEY_CHARS} characters and no spaces"
                )
            digests.append(_digest(line))
        if not digests:
            raise ValueError(f"{where} holds no API keys")
        return cls(digests)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ApiKeys:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"API key file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"API key file {path} is not UTF-8 text") from err
        keys = cls.from_lines(text.splitlines(), str(path))
        plain = [ln for ln in map(str.strip, text.splitlines()) if ln and not ln.startswith(("#", "sha256:"))]
        if plain and path.stat().st_mode & 0o077:
            log.warning("API key file %s is readable by other users; chmod 600 it, or store sha256: lines", path)
        return keys

    @classmethod
    def from_env(cls, var: str = ENV_VAR) -> ApiKeys | None:
        """Keys from ``$var`` (separated by commas or newlines), or None when it is unset or empty."""
        value = os.environ.get(var, "").strip()
        if not value:
            return None
        return cls.from_lines(value.replace(",", "\n").splitlines(), f"${var}")

    def check(self, token: str | None) -> bool:
        """True when ``token`` is one of the keys. Every stored digest is compared, whatever matches."""
        if not token:
            return False
        presented = _digest(token)
        ok = False
        for digest in self._digests:
            ok |= hmac.compare_digest(presented, digest)
        return ok


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def is_loopback(host: str) -> bool:
    """True when binding ``host`` is reachable from this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


def check_bind(host: str, no_auth: bool, public_ok: bool) -> None:
    """Refuse anonymous access on an address that other machines can reach, unless confirmed."""
    if no_auth and not is_loopback(host) and not public_ok:
        raise ValueError(
            f"--no-auth on {host} lets anyone who can reach this machine use the detector and probe the "
            "watermark; bind 127.0.0.1, give --api-keys, or confirm with --i-know-this-is-public"
        )


def load_api_keys(path: str | os.PathLike | None) -> ApiKeys:
    """Keys from ``path`` if given, else from $OPENSTAMP_API_KEYS; a clear error when neither has any."""
    if path is not None:
        return ApiKeys.from_file(path)
    keys = ApiKeys.from_env()
    if keys is None:
        raise ValueError(
            f"no API keys: give --api-keys FILE (one key per line) or set ${ENV_VAR}, or pass --no-auth for local use"
        )
    return keys
