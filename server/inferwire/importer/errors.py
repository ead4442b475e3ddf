"""The importer's one kind of failure: a source or an option it cannot take, said in a line."""

from __future__ import annotations


class ImportRefusedError(Exception):
    """The import cannot go on; the message is the one line the user reads."""
