"""Token ids for workload segments, so that token-level prefix matching equals the workload's
segment semantics (equal keys mean equal tokens, a prefix of a key is a prefix of its tokens).

Each content key gets one lead token, unique to the key; the rest of its tokens are one shared
filler id. Two different keys therefore differ at their first token, and a key's tokens
``[0, n)`` are a prefix of its tokens ``[0, m)`` for ``n <= m``. A radix tree over these ids
(SGLang's) and the simulator's tree over `(key, offset)` pieces match exactly the same prefixes.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from topas_bench.workloads.model import Segment, Workload, output_key

FILLER = 5  # any id below FIRST_LEAD other than the model's special tokens (BOS 1, EOS 2)
EOS = 2
FIRST_LEAD = 1000


class TokenIds:
    """Lead ids assigned in first-seen order over a workload (deterministic for a workload)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._lead: dict[str, int] = {}
        for key in keys:
            if key not in self._lead:
                self._lead[key] = FIRST_LEAD + len(self._lead)

    @classmethod
    def of(cls, w: Workload) -> TokenIds:
        def keys() -> Iterable[str]:
            for t, s in w.stages():
                for seg in s.prompt:
                    yield seg.key
                yield output_key(t.id, s.id)

        return cls(keys())

    @property
    def vocab_size(self) -> int:
        return FIRST_LEAD + len(self._lead) + 1

    def lead(self, key: str) -> int:
        return self._lead[key]

    def segment(self, key: str, tokens: int) -> list[int]:
        return [self._lead[key], *([FILLER] * (tokens - 1))] if tokens > 0 else []

    def prompt(self, segments: Sequence[Segment]) -> array[int]:
        out: array[int] = array("q")
        for seg in segments:
            out.extend(self.segment(seg.key, seg.tokens))
        return out
