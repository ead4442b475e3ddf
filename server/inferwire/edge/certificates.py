"""The `server.tls` files, for every listener: read and checked at start-up, read again
when they change on disk, so certificates rotate without a restart.

Each transport asks `CertificateFiles.changed` before each new connection's handshake
(gRPC through its certificate fetcher, api/tls.py; HTTP through the TLS context's SNI
callback, http/listener.py): new material, or None to keep the current one. A connection
that is already open keeps the keys it negotiated and is never touched, so streams in
flight survive a rotation.

Because it runs once per handshake, the check must be cheap: it `stat`s the files
(following symbolic links, so the atomic `..data` swap of a Kubernetes Secret or
ConfigMap volume shows as a new inode) and reads them only when a stat changed, or at
most every `FULL_CHECK_INTERVAL_S` in case a file was rewritten in place without a
visible change. New content is checked as at start-up (certificate and key parse and
match, the CA parses) before a listener gets it; content that does not pass, such as a key
written before its certificate, keeps the previous files in use, is logged once, and is
read again as soon as a file changes once more.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from inferwire.addresses import is_unix_socket, split_host_port
from inferwire.config import TlsSettings
from inferwire.core.errors import ConfigurationError

log = logging.getLogger(__name__)

FULL_CHECK_INTERVAL_S = 10.0
"""Longest time between two reads of the files when their stats do not change."""


@dataclass(frozen=True)
class Material:
    """The bytes of the certificate chain, its key and the client CA (if any)."""

    cert: bytes
    key: bytes
    client_ca: bytes | None


class _EncryptedKeyError(Exception):
    pass


def _no_password() -> bytes:
    # Without this, OpenSSL would prompt on the terminal for an encrypted key's password.
    raise _EncryptedKeyError


def _read(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"server.tls.{setting}: cannot read {path}: {exc.strerror or exc}"
        ) from None


def _check_certificates(setting: str, path: Path, pem: bytes) -> None:
    """That `pem` holds at least one PEM certificate, and only parseable ones."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # ValueError: empty, or not ASCII
        why = getattr(exc, "reason", None) or str(exc).split(" (_ssl.c")[0]
        raise ConfigurationError(
            f"server.tls.{setting}: {path} is not a PEM certificate file ({why})"
        ) from None


def _check_pair(cert_path: Path, key_path: Path) -> None:
    """That the key parses, is not encrypted and belongs to the certificate."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            cert_path, key_path, password=_no_password
        )
    except _EncryptedKeyError:
        raise ConfigurationError(
            f"server.tls.key_file: {key_path} is encrypted; inferwire needs an unencrypted key"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            why = f"does not match the certificate in {cert_path}"
        else:
            why = "is not a PEM private key"
        raise ConfigurationError(f"server.tls.key_file: {key_path} {why}") from None


def read_material(settings: TlsSettings) -> Material:
    """Read and check the files; raises ConfigurationError naming the setting and the file."""
    assert settings.cert_file is not None and settings.key_file is not None
    cert = _read("cert_file", settings.cert_file)
    key = _read("key_file", settings.key_file)
    client_ca = None
    if settings.client_ca_file is not None:
        client_ca = _read("client_ca_file", settings.client_ca_file)
        _check_certificates("client_ca_file", settings.client_ca_file, client_ca)
    _check_certificates("cert_file", settings.cert_file, cert)
    # The pair is checked by path (the ssl module reads only files): read again, so
    # that what a listener gets is what was checked.
    _check_pair(settings.cert_file, settings.key_file)
    checked = (_read("cert_file", settings.cert_file), _read("key_file", settings.key_file))
    if checked != (cert, key):
        raise ConfigurationError(
            f"server.tls: {settings.cert_file} or {settings.key_file} changed while being read"
        )
    return Material(cert, key, client_ca)


class CertificateFiles:
    """The files of `server.tls`, read at start-up and again when they change on disk."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self._paths = [
            p for p in (settings.cert_file, settings.key_file, settings.client_ca_file) if p
        ]
        self._lock = threading.Lock()
        self._stamp = self._current_stamp()
        self._material = read_material(settings)  # ConfigurationError: a start-up error
        self._next_full_check = time.monotonic() + FULL_CHECK_INTERVAL_S
        self._problem = ""  # the last reason new files were refused, logged once

    @property
    def mutual(self) -> bool:
        return self.settings.client_ca_file is not None

    def _current_stamp(self) -> tuple[object, ...]:
        stamp: list[object] = []
        for path in self._paths:
            try:
                st = os.stat(path)  # follows links: a `..data` swap is a new inode
                stamp.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError as exc:  # mid-rotation; checked again on the next handshake
                stamp.append(exc.errno)
        return tuple(stamp)

    @property
    def material(self) -> Material:
        """What is in use now."""
        return self._material

    def changed(self) -> Material | None:
        """New material when the files changed and pass the checks, else None.

        Never raises: a failure keeps the certificate in use.
        """
        try:
            return self._changed()
        except Exception:
            log.exception("TLS: checking the certificate files failed; keeping the current ones")
            return None

    def _changed(self) -> Material | None:
        stamp = self._current_stamp()
        with self._lock:
            now = time.monotonic()
            if stamp == self._stamp and now < self._next_full_check:
                return None
            self._stamp, self._next_full_check = stamp, now + FULL_CHECK_INTERVAL_S
            try:
                material = read_material(self.settings)
            except ConfigurationError as exc:
                if str(exc) != self._problem:
                    self._problem = str(exc)
                    log.warning(
                        "TLS files changed but cannot be used; the previous ones stay in use",
                        extra={"reason": self._problem},
                    )
                return None
            self._problem = ""
            if material == self._material:
                return None
            self._material = material
        log.info(
            "TLS certificate files reloaded", extra={"cert_file": str(self.settings.cert_file)}
        )
        return material


def is_loopback(address: str) -> bool:
    """Whether a listening address can only be reached from this machine."""
    if is_unix_socket(address):
        return True
    try:
        host, _ = split_host_port(address)
    except ValueError:  # not host:port (the configuration refuses those): say it may not be
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def log_transport_security(address: str, files: CertificateFiles | None) -> None:
    """Say at start-up how the listener is secured; warn once about plaintext off loopback."""
    if files is not None:
        log.info(
            "TLS on" + (", client certificates required" if files.mutual else ""),
            extra={
                "cert_file": str(files.settings.cert_file),
                "client_ca_file": str(files.settings.client_ca_file or ""),
            },
        )
    elif not is_loopback(address):
        log.warning(
            "listening without TLS on a non-loopback address: traffic, prompts included, "
            "is plaintext; set server.tls.cert_file and server.tls.key_file to turn TLS on",
            extra={"address": address},
        )
