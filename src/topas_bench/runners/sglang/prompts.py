"""Deterministic prompt text with exact per-segment token counts, in the server's tokenizer.

Each segment (docs/design.md section 2) becomes text made of words that are one token each in the
model's tokenizer, each preceded by a space: " w1 w2 ... wn" is n tokens for tokenizers that
split words at spaces before merging (byte-level BPE as in Llama-3 and Qwen2, WordLevel), so
segments concatenate without merging across their boundary. The words are drawn from a fixed
pool by a generator seeded with the segment's key: equal keys give equal text, so an agent's
prefix is byte-identical in every call and the server's prefix cache can share it.

The tokenizer is the server's own (`/tokenize`, which SGLang and vLLM both serve), so counts
are exactly what the server will see, special tokens included: the agent prefix is shortened
by the tokens the server adds (a BOS), and every built prompt is checked against the server's
count before it is sent (a mismatch is an error, never a silently different workload).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from topas_bench.errors import TopasError
from topas_bench.workloads.model import Segment

if TYPE_CHECKING:
    from openai import AsyncOpenAI

#: Candidate words; the builder keeps those that are one token in the server's tokenizer.
_WORDS = (
    "the of and to in is for on that with as was at by be this from are or an have not they "
    "which one you were all we her she there been their has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may "
    "then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three states himself few house "
    "use during without again place around however home small found thought went say part "
    "once general high upon school every don does got united left number course war until "
    "always away something fact though water less public put think almost hand enough far took "
    "head yet government system better set told nothing night end why called didn find look "
    "asked later point knew city next program business give group toward young days let room "
    "president side social given present several order national possible rather second face "
    "per among form important often things looked early white case john become large big need "
    "four within felt along children saw best church ever least power development light"
)
WORDS = tuple(_WORDS.split())


def tiny_model_words() -> list[str]:
    """The vocabulary of `scripts/make_tiny_llama.py`'s test model: every prompt word, plus
    spares for the generated text."""
    return [*WORDS, *(f"w{i}" for i in range(100))]


Tokenize = Callable[[str, bool], Awaitable[int]]  # (text, add_special_tokens) -> token count


class PromptError(TopasError):
    """The server's tokenizer cannot express the workload's token counts exactly."""


class PromptBuilder:
    """Builds the text of a stage's prompt from its segments; `await prepare()` first."""

    def __init__(self, tokenize: Tokenize, min_pool: int = 64) -> None:
        self._tokenize = tokenize
        self._min_pool = min_pool
        self.pool: tuple[str, ...] = ()
        self.special_tokens = 0
        self._memo: dict[tuple[str, int], str] = {}

    async def prepare(self) -> None:
        """Pick the one-token words and count the special tokens the server adds."""
        self.special_tokens = await self._tokenize("", True)
        self.pool = tuple(await self._single_token_words(list(WORDS)))
        if len(self.pool) < self._min_pool:
            raise PromptError(
                f"only {len(self.pool)} of {len(WORDS)} common words are one token each in the "
                f"server's tokenizer (need {self._min_pool}); it cannot express exact lengths"
            )

    async def _single_token_words(self, words: list[str]) -> list[str]:
        if not words:
            return []
        if await self._tokenize(_join(words), False) == len(words):
            return words  # n words, each at least one token: each exactly one
        if len(words) == 1:
            return []
        mid = len(words) // 2
        return await self._single_token_words(words[:mid]) + await self._single_token_words(
            words[mid:]
        )

    def segment_text(self, key: str, tokens: int) -> str:
        memo = self._memo.get((key, tokens))
        if memo is None:
            rng = random.Random(hashlib.sha256(key.encode()).digest())
            memo = _join([self.pool[rng.randrange(len(self.pool))] for _ in range(tokens)])
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[(key, tokens)] = memo
        return memo

    def text(self, segments: Sequence[Segment]) -> str:
        """The prompt text; the first segment (the agent prefix) gives up the special tokens."""
        if not self.pool:
            raise PromptError("PromptBuilder.prepare() was not awaited")
        parts = []
        for i, seg in enumerate(segments):
            n = seg.tokens - self.special_tokens if i == 0 else seg.tokens
            if n < 0:
                raise PromptError(
                    f"segment {seg.key!r} has {seg.tokens} tokens, fewer than the "
                    f"{self.special_tokens} special tokens the server adds"
                )
            parts.append(self.segment_text(seg.key, n))
        return "".join(parts)

    async def checked_text(self, segments: Sequence[Segment]) -> str:
        text = self.text(segments)
        want = sum(s.tokens for s in segments)
        got = await self._tokenize(text, True)
        if got != want:
            raise PromptError(
                f"prompt of {want} tokens came out as {got} in the server's tokenizer "
                f"(segments {[s.key for s in segments]}); its tokenizer merges across words"
            )
        return text


def _join(words: Sequence[str]) -> str:
    return "".join(" " + w for w in words)


def server_tokenizer(api: AsyncOpenAI, model: str) -> Callable[[str, bool], Awaitable[int]]:
    """`Tokenize` through the server's `/tokenize` endpoint (SGLang and vLLM), on the run's
    client (`api.connect`)."""
    from topas_bench.runners.sglang.api import tokenize

    async def count(text: str, add_special_tokens: bool) -> int:
        return await tokenize(api, model, text, add_special_tokens)

    return count
