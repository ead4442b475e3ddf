"""`inferwire models import` as a user runs it: the same import again reuses the build,
`--add-to` adds the models entry once, and every source it cannot take is one clear line
with exit status 1 and nothing left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import yaml

from inferwire.importer.errors import ImportRefusedError
from inferwire.importer.pipeline import _disk_errors
from scripts.smollm2 import GGUF
from tests.realmodel.conftest import INT4, _missing

INFERWIRE = Path(sys.executable).with_name("inferwire")

pytestmark = pytest.mark.skipif(bool(_missing()), reason="run `make realmodel-models` first")


def run_import(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(INFERWIRE), "models", "import", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_the_same_import_again_reuses_the_build_and_prints_its_entry():
    done = run_import(str(GGUF), "--name", "smollm2", "--out", str(INT4))
    assert done.returncode == 0, done.stderr
    assert "reusing it" in done.stderr
    entry = yaml.safe_load(done.stdout)["models"][0]
    assert entry == {
        "name": "smollm2",
        "backend": "onnxruntime-genai",
        "options": {"path": str(INT4)},
    }


def test_add_to_adds_the_entry_once_and_refuses_a_name_taken_by_another(tmp_path):
    config = tmp_path / "inferwire.yaml"
    config.write_text(yaml.safe_dump({"server": {"address": "127.0.0.1:0"}, "models": []}))
    for _ in range(2):
        done = run_import(
            str(GGUF), "--name", "smollm2", "--out", str(INT4), "--add-to", str(config)
        )
        assert done.returncode == 0, done.stderr
    data = yaml.safe_load(config.read_text())
    assert [m["name"] for m in data["models"]] == ["smollm2"]
    assert data["server"] == {"address": "127.0.0.1:0"}
    other = tmp_path / "other.yaml"
    other.write_text(
        yaml.safe_dump({"models": [{"name": "smollm2", "backend": "onnxruntime-genai"}]})
    )
    refused = run_import(str(GGUF), "--name", "smollm2", "--out", str(INT4), "--add-to", str(other))
    assert refused.returncode == 1
    assert "a model named 'smollm2' is configured already" in refused.stderr


def small_gguf(path: Path, architecture: str, pre: str = "smollm") -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b"])
    writer.add_tensor("token_embd.weight", gguf.np.zeros((2, 4), dtype=gguf.np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: (d / "notes.gguf").write_text("hello") and d / "notes.gguf", "not a GGUF file"),
        (
            lambda d: small_gguf(d / "g.gguf", "gpt2"),
            "architecture 'gpt2' is not one the importer converts",
        ),
        (
            lambda d: small_gguf(d / "p.gguf", "llama", pre="mystery"),
            "pre-tokenizer 'mystery' is not one the importer knows",
        ),
        (
            lambda d: (d / "ckpt").mkdir() or d / "ckpt",
            "not a Hugging Face checkpoint (no config.json",
        ),
        (lambda d: d / "nowhere", "no such file or directory"),
    ],
    ids=["text file", "architecture", "pre-tokenizer", "checkpoint without config", "missing"],
)
def test_a_source_it_cannot_take_is_one_line_and_leaves_nothing(tmp_path, make, says):
    source = make(tmp_path)
    out = tmp_path / "models" / "x"
    done = run_import(str(source), "--name", "x", "--out", str(out))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and says in lines[-1], done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()
    assert (
        not any((tmp_path / "models").glob(".x.importing-*"))
        if (tmp_path / "models").exists()
        else True
    )


def test_a_full_disk_is_one_line_that_says_so():
    # /dev/full answers every write with ENOSPC, as a full disk does.
    refused = pytest.raises(ImportRefusedError, match="disk full while writing under /dev")
    with refused, _disk_errors(Path("/dev")), open("/dev/full", "w") as full:
        full.write("x")
        full.flush()


def test_a_hugging_face_checkpoint_imports_and_runs_as_its_gguf_twin(tmp_path):
    # The checkpoint the GGUF path writes is a Hugging Face checkpoint like any other:
    # imported from the directory, in fp32, it makes the same greedy tokens as the fp32
    # import of the GGUF.
    import onnxruntime_genai as og

    from inferwire.importer.gguf_checkpoint import open_gguf, write_checkpoint
    from tests.realmodel.conftest import FP32
    from tests.realmodel.corpus import chatml

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    write_checkpoint(open_gguf(GGUF), checkpoint)
    out = tmp_path / "from-checkpoint"
    done = run_import(str(checkpoint), "--name", "ckpt", "--precision", "fp32", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "Hugging Face checkpoint" in done.stderr

    def greedy(path: Path) -> list[int]:
        model = og.Model(str(path))
        ids = og.Tokenizer(model).encode(chatml("What is the capital of Japan?"))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 16, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)[len(ids) :]]

    assert greedy(out) == greedy(FP32)
