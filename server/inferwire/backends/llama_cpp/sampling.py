"""A request's sampling: its settings in llama.cpp's terms, and the `TokenPicker` that
chooses its tokens.

A greedy request without a repetition penalty takes the argmax of its logits row with
numpy (the end-of-generation tokens masked while a minimum length holds): llama.cpp's
sampler would first copy the whole vocabulary into a candidate array for every token,
some 49k entries on SmolLM2. Anything else runs a llama.cpp sampler chain in
llama-server's order for the settings inferwire takes: the end-of-generation tokens
masked (while a minimum length holds), the repetition penalty, then greedy, or top-k,
top-p, temperature and a seeded draw. A request that leaves temperature unset is greedy,
as ONNX Runtime GenAI's import of the same model is (`do_sample: false`).
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass

import llama_cpp as llama
import numpy as np

from inferwire.core.prepared import PreparedRequest
from inferwire.core.sampling import GenerationParams

_SEEDS = random.Random()
MAX_SEED = 2**32 - 2  # llama.cpp's seed is a uint32; 2**32 - 1 means "draw one"


@dataclass(frozen=True)
class ChainSettings:
    """How one request samples (None: unset)."""

    temperature: float  # 0: greedy
    top_p: float | None
    top_k: int | None
    seed: int
    repetition_penalty: float
    penalty_window: int  # tokens the penalty looks back over (the slot's length)

    @classmethod
    def of(cls, params: GenerationParams, repetition_penalty: float, window: int) -> ChainSettings:
        seed = params.seed if params.seed is not None else _SEEDS.randrange(MAX_SEED)
        return cls(
            params.temperature or 0.0,
            params.top_p,
            params.top_k,
            seed,
            repetition_penalty,
            window,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class SamplerChain:
    """A llama.cpp sampler chain, freed with the request."""

    def __init__(
        self, sampling: ChainSettings, eog_tokens: frozenset[int], vocab_size: int
    ) -> None:
        params = llama.llama_sampler_chain_default_params()
        self.chain = llama.llama_sampler_chain_init(params)
        if eog_tokens:
            biases = (llama.llama_logit_bias * len(eog_tokens))()
            for slot, token in zip(biases, sorted(eog_tokens), strict=True):
                slot.token, slot.bias = token, float("-inf")
            self._add(llama.llama_sampler_init_logit_bias(vocab_size, len(eog_tokens), biases))
        if sampling.repetition_penalty != 1.0:
            self._add(
                llama.llama_sampler_init_penalties(
                    vocab_size, sampling.penalty_window, sampling.repetition_penalty, 0.0, 0.0
                )
            )
        if sampling.greedy:
            self._add(llama.llama_sampler_init_greedy())
            return
        if sampling.top_k:
            self._add(llama.llama_sampler_init_top_k(min(sampling.top_k, vocab_size)))
        if sampling.top_p is not None and sampling.top_p < 1.0:
            self._add(llama.llama_sampler_init_top_p(sampling.top_p, 1))
        self._add(llama.llama_sampler_init_temp(sampling.temperature))
        self._add(llama.llama_sampler_init_dist(sampling.seed))

    def _add(self, sampler: ctypes.c_void_p) -> None:
        llama.llama_sampler_chain_add(self.chain, sampler)

    def accept(self, token: int) -> None:
        llama.llama_sampler_accept(self.chain, token)

    def sample(self, context: llama.llama_context_p, index: int) -> int:
        """The next token from the logits at batch row `index` (accepted into the chain)."""
        return int(llama.llama_sampler_sample(self.chain, context, index))

    def free(self) -> None:
        if self.chain:
            llama.llama_sampler_free(self.chain)
            self.chain = None


class TokenPicker:
    """Chooses a request's tokens from the logits llama_decode left; freed with the request."""

    def __init__(
        self,
        sampling: ChainSettings,
        min_tokens: int,
        max_tokens: int,
        eog: frozenset[int],
        vocab: int,
    ) -> None:
        self._vocab = vocab
        self._eog = np.fromiter(sorted(eog), dtype=np.int64)
        self._penalised = sampling.repetition_penalty != 1.0
        self._fast = sampling.greedy and not self._penalised
        # Two chains when the end-of-generation mask applies for part of the output only:
        # the sampled token is accepted into both, so the penalty's history stays whole.
        self._masked = self._free = None
        if not self._fast:
            if min_tokens > 0:
                self._masked = SamplerChain(sampling, eog, vocab)
            if min_tokens < max_tokens:
                self._free = SamplerChain(sampling, frozenset(), vocab)

    def accept_prompt(self, prompt: list[int]) -> None:
        """The penalty counts the prompt's tokens too (as ONNX Runtime GenAI's does)."""
        if not self._penalised:
            return
        for chain in (self._masked, self._free):
            if chain is not None:
                for token in prompt:
                    chain.accept(token)

    def pick(self, context: llama.llama_context_p, row: int, mask_eog: bool) -> int:
        if self._fast:
            pointer = llama.llama_get_logits_ith(context, row)
            logits = np.ctypeslib.as_array(pointer, shape=(self._vocab,))
            if mask_eog:
                logits[self._eog] = -np.inf  # llama.cpp's buffer, rewritten by the next step
            return int(logits.argmax())
        chain, other = (self._masked, self._free) if mask_eog else (self._free, self._masked)
        assert chain is not None
        token = chain.sample(context, row)
        if other is not None:
            other.accept(token)
        return token

    def free(self) -> None:
        for chain in (self._masked, self._free):
            if chain is not None:
                chain.free()


SlotRequest = PreparedRequest[ChainSettings]  # what the step loop is handed
