"""SmolLM2's tokenizer and chat template as inferwire runs them, against llama.cpp on the
same GGUF and against the template's own Jinja with Hugging Face's semantics."""

from __future__ import annotations

import json

import httpx
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferwire.v1 import inference_pb2 as pb
from tests.realmodel.conftest import INT4
from tests.realmodel.corpus import CORPUS

SPECIAL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


async def test_every_corpus_string_tokenizes_as_llama_cpp_tokenizes_it(stub, reference):
    differing = []
    for text, expected in zip(CORPUS, reference["tokenize"], strict=True):
        found = list(
            (await stub.Tokenize(pb.TokenizeRequest(model="smollm2", prompt=text))).token_ids
        )
        if found != expected:
            differing.append((text, found, expected))
    assert differing == [], differing
    assert len(CORPUS) == len(reference["tokenize"]) >= 25


async def test_the_http_door_tokenizes_alike_and_detokenize_round_trips(smollm2_server, reference):
    async with httpx.AsyncClient(base_url=smollm2_server.http_url, timeout=60) as client:
        for text, expected in zip(CORPUS, reference["tokenize"], strict=True):
            tokens = (
                await client.post("/tokenize", json={"model": "smollm2", "prompt": text})
            ).json()
            assert tokens["tokens"] == expected, text
            back = await client.post("/detokenize", json={"model": "smollm2", "tokens": expected})
            if not any(marker in text for marker in SPECIAL):
                assert back.json()["prompt"] == text
            else:  # special tokens are markup, not text: detokenizing leaves them out
                stripped = text
                for marker in SPECIAL:
                    stripped = stripped.replace(marker, "")
                assert back.json()["prompt"] == stripped


def hf_render(messages: list[dict[str, str]]) -> str:
    """The GGUF's template as transformers renders it (apply_chat_template's environment)."""
    config = json.loads((INT4 / "tokenizer_config.json").read_text())
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = environment.from_string(config["chat_template"])
    return template.render(
        messages=messages,
        add_generation_prompt=True,
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
    )


CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "user only": [{"role": "user", "content": "Hi there"}],
    "system and user": [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Hello"},
    ],
    "multi-turn": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "system, multi-turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another, with  two spaces\nand a newline."},
    ],
}


@pytest.mark.parametrize("conversation", CONVERSATIONS)
async def test_the_chat_template_renders_as_hugging_face_renders_it(stub, conversation):
    messages = CONVERSATIONS[conversation]
    reply = await stub.Tokenize(
        pb.TokenizeRequest(
            model="smollm2",
            messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages],
        )
    )
    expected = hf_render(messages)
    assert reply.rendered_prompt == expected
    default_system = "You are a helpful AI assistant named SmolLM"
    given_system = messages[0]["role"] == "system"
    assert (default_system in reply.rendered_prompt) is not given_system
    assert reply.rendered_prompt.endswith("<|im_start|>assistant\n")
