"""Bearer tokens and their scopes, transport-neutral.

A tokens file is a YAML list of `{name, sha256, scopes, models, tenant}`: only the SHA-256 hex
digest of each token is stored. `TokenStore` re-reads the file when it changes (a mounted
Kubernetes Secret swaps its `..data` symlink), so tokens are added and revoked without a
restart; a file that turns invalid keeps the last good set.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from inferwire.core.errors import ConfigurationError, PermissionDeniedError, UnauthenticatedError

log = logging.getLogger(__name__)

# Random bytes in a fresh token; the prefix lets secret scanners recognise one.
TOKEN_BYTES = 32
TOKEN_PREFIX = "iwt_"
# How often, at most, the tokens file's stat is checked for a change.
RELOAD_CHECK_INTERVAL_S = 1.0
_MAX_NAME_CHARS = 64


class Scope(enum.StrEnum):
    """What a token may do: `infer` runs models and reads their state; `admin` does all of
    that and manages models; `gateway` lets a caller speak for others (the inference
    gateway's fairness and objective headers), and is never implied by `admin`."""

    INFER = "infer"
    ADMIN = "admin"
    GATEWAY = "gateway"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name (or `anonymous`, or a client certificate's subject),
    its scopes, its model patterns and its tenant (default: named like the principal)."""

    name: str
    scopes: frozenset[Scope]
    models: tuple[str, ...] = ("*",)
    tenant_name: str | None = None

    @property
    def tenant(self) -> str:
        return self.tenant_name or self.name

    def has_scope(self, scope: Scope) -> bool:
        if scope is Scope.GATEWAY:
            return scope in self.scopes  # only when the entry lists it
        return Scope.ADMIN in self.scopes or scope in self.scopes

    def may_use(self, model: str) -> bool:
        # "*" (every token without a model list) matches anything: no pattern to run.
        return "*" in self.models or any(fnmatch.fnmatchcase(model, p) for p in self.models)

    def require_model(self, model: str) -> None:
        """Raise PermissionDeniedError unless this principal may use `model`."""
        if not self.may_use(model):
            raise PermissionDeniedError(
                f"the credentials of {self.name!r} do not cover model {model!r}"
            )


ANONYMOUS = "anonymous"
# The caller when no tokens file is configured: every RPC is open.
UNRESTRICTED = Principal(ANONYMOUS, frozenset({Scope.INFER, Scope.ADMIN}))


@dataclass(frozen=True)
class TokenEntry:
    """One entry of the tokens file."""

    name: str
    sha256: str
    scopes: frozenset[Scope]
    models: tuple[str, ...]
    tenant: str | None = None

    def principal(self) -> Principal:
        return Principal(self.name, self.scopes, self.models, self.tenant)


def hash_token(token: str) -> str:
    """The lowercase hex SHA-256 digest of a token, as the tokens file stores it."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token: TOKEN_BYTES bytes from `secrets`, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


class _Quoted(str):
    """A string written in double quotes: a digest of digits alone would read back as a
    number, so the tokens-file entry quotes it, as the docs ask people to."""


class _EntryDumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML has no stubs here
    pass


_EntryDumper.add_representer(
    _Quoted, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, '"')
)


def entry_yaml(
    name: str,
    digest: str,
    scopes: Iterable[Scope],
    models: Iterable[str],
    tenant: str | None = None,
) -> str:
    """A tokens-file entry as YAML, ready to append to the file's list."""
    entry: dict[str, object] = {
        "name": name,
        "sha256": _Quoted(digest),
        "scopes": sorted(str(s) for s in scopes),
    }
    if patterns := list(models):
        entry["models"] = patterns
    if tenant:
        entry["tenant"] = tenant
    text: str = yaml.dump([entry], Dumper=_EntryDumper, sort_keys=False, default_flow_style=None)
    return text


def parse_tokens(
    text: str, source: str, tenants: frozenset[str] | None = None
) -> tuple[TokenEntry, ...]:
    """Parse a tokens file; raise ConfigurationError naming the entry and key that is wrong.

    `tenants`: the configured tenant names an entry's `tenant` must be one of (None: any).
    """
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{source}: not valid YAML: {exc}") from None
    if content is None:
        return ()
    if not isinstance(content, list):
        raise ConfigurationError(f"{source}: must be a YAML list of tokens")
    entries = tuple(_entry(raw, f"{source}[{i}]") for i, raw in enumerate(content))
    for attribute in ("name", "sha256"):
        values = [getattr(e, attribute) for e in entries]
        if duplicated := sorted({v for v in values if values.count(v) > 1}):
            raise ConfigurationError(f"{source}: {attribute} {duplicated[0]!r} appears twice")
    for i, entry in enumerate(entries):
        if tenants is not None and entry.tenant is not None and entry.tenant not in tenants:
            raise ConfigurationError(
                f"{source}[{i}].tenant: {entry.tenant!r} is not a tenant of server.tenants"
            )
    return entries


def _entry(raw: object, where: str) -> TokenEntry:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where}: must be a mapping with name, sha256 and scopes")
    if unknown := sorted(set(raw) - {"name", "sha256", "scopes", "models", "tenant"}):
        raise ConfigurationError(f"{where}.{unknown[0]}: unknown key")
    name, digest = raw.get("name"), raw.get("sha256")
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME_CHARS:
        raise ConfigurationError(f"{where}.name: must be a string of 1 to {_MAX_NAME_CHARS} chars")
    if not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
        raise ConfigurationError(
            f"{where}.sha256: must be 64 hex digits, as a string (inferwire token hash)"
        )
    scopes = raw.get("scopes")
    if not isinstance(scopes, list) or not scopes:
        raise ConfigurationError(
            f"{where}.scopes: must be a non-empty list (infer, admin, gateway)"
        )
    try:
        parsed_scopes = frozenset(Scope(s) for s in scopes)
    except ValueError:
        raise ConfigurationError(f"{where}.scopes: each must be infer, admin or gateway") from None
    models = raw.get("models", ["*"])
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ConfigurationError(f"{where}.models: must be a non-empty list of glob patterns")
    tenant = raw.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise ConfigurationError(f"{where}.tenant: must be a tenant's name")
    return TokenEntry(name, digest.lower(), parsed_scopes, tuple(models), tenant)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def _file_identity(path: Path) -> tuple[str, int, int, int]:
    """What changes when the file does: the resolved target (a Secret's `..data` symlink
    swap changes it), and its inode, modification time and size."""
    target = os.path.realpath(path)
    stat = os.stat(target)
    return target, stat.st_ino, stat.st_mtime_ns, stat.st_size


class TokenStore:
    """The tokens of a tokens file, re-read when the file changes.

    The file is stat-ed at most every `check_interval_s`, when a token is checked. That
    is a small blocking read on the caller's thread, once a second at most: cheaper than
    a watcher task, and a server that receives no calls has nothing to refresh.
    """

    def __init__(
        self,
        path: Path,
        check_interval_s: float = RELOAD_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        tenants: frozenset[str] | None = None,
    ) -> None:
        """`tenants`: the configured tenant names entries may name (None: any)."""
        self.path = path
        self._tenants = tenants
        self._check_interval_s = check_interval_s
        self._clock = clock
        try:
            self._identity = _file_identity(path)
            self._entries = parse_tokens(path.read_text(), str(path), tenants)
        except OSError as exc:
            raise ConfigurationError(f"tokens file {path}: {exc.strerror or exc}") from None
        self._checked_at = clock()
        self._failed_identity: object = None

    @property
    def entries(self) -> tuple[TokenEntry, ...]:
        self._refresh()
        return self._entries

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of `token`, or None for a token no entry has.

        The digest is compared with every entry, in constant time, so neither the
        comparison nor the loop tells how much of a digest matched.
        """
        if token is None:
            return None
        digest = hash_token(token)
        found: TokenEntry | None = None
        for entry in self.entries:
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        return found.principal() if found is not None else None

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked_at < self._check_interval_s:
            return
        self._checked_at = now
        try:
            identity = _file_identity(self.path)
            if identity == self._identity:
                return
            entries = parse_tokens(Path(identity[0]).read_text(), str(self.path), self._tenants)
        except (OSError, ConfigurationError) as exc:
            # Keep serving with the last good tokens; say so once per broken version.
            failed = getattr(exc, "filename", None), str(exc)
            if failed != self._failed_identity:
                self._failed_identity = failed
                log.error(
                    "tokens file not reloaded; keeping the last good tokens",
                    extra={"path": str(self.path), "error": str(exc)},
                )
            return
        self._identity, self._entries, self._failed_identity = identity, entries, None
        log.info("tokens file reloaded", extra={"path": str(self.path), "tokens": len(entries)})


def anonymous_principal(scopes: Iterable[Scope]) -> Principal | None:
    """The principal of a caller without a token, or None when it gets no scope."""
    granted = frozenset(scopes)
    return Principal(ANONYMOUS, granted) if granted else None


def authorize(principal: Principal | None, scope: Scope, what: str) -> Principal:
    """Check that `principal` may call `what`, which needs `scope`.

    A caller without credentials (or an anonymous one lacking the scope) is
    unauthenticated: presenting a token is what would help. A known token without the
    scope is denied.
    """
    if principal is None:
        raise UnauthenticatedError(f"{what} needs a token with scope {scope}; none was sent")
    if not principal.has_scope(scope):
        if principal.name == ANONYMOUS:
            raise UnauthenticatedError(
                f"{what} needs a token with scope {scope}; anonymous callers lack it"
            )
        raise PermissionDeniedError(
            f"{what} needs scope {scope}; the credentials of {principal.name!r} lack it"
        )
    return principal


def identify(store: TokenStore, anonymous: Principal | None, token: str | None) -> Principal | None:
    """The caller behind `token`: `anonymous` when none was sent (None: no anonymous access).

    A token that no entry has is UNAUTHENTICATED: it never falls back to anonymous.
    """
    if token is None:
        return anonymous
    principal = store.authenticate(token)
    if principal is None:
        raise UnauthenticatedError("the bearer token is not valid (unknown or revoked)")
    return principal
