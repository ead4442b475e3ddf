"""Files named by flags: read one way, refused in one style (`cannot read PATH: why`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def _refuse(flag: str, why: str) -> typer.BadParameter:
    return typer.BadParameter(why, param_hint=f"'{flag}'")


def read_bytes(path: Path, flag: str) -> bytes:
    """The file's bytes; a missing file, a directory or no permission is a usage error."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _refuse(flag, f"cannot read {path}: {exc.strerror or exc}") from None


def read_text(path: Path, flag: str) -> str:
    """The file as UTF-8 text (newlines read as Python's text files read them)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _refuse(flag, f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _refuse(flag, f"cannot read {path}: not UTF-8 (byte {exc.start + 1})") from None


def read_json(path: Path, flag: str) -> str:
    """The file's text, checked here to be JSON, so a typo is not sent to the server."""
    text = read_text(path, flag)
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise _refuse(
            flag, f"{path} is not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return text
