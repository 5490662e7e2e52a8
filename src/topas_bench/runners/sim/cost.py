"""The per-iteration cost model of the simulated engine (docs/design.md section 4).

`CostModel` turns a preset (`preset.py`: GPU, model, efficiencies) into iteration durations with
rooflines plus fitted overheads. The original model, still the one of every preset that leaves
the newer terms at 0, is one roofline for the whole iteration:

    T = c_step + c_layer*L + c_req*B + max(FLOPs/(peak*eta_c), W/(BW*eta_w) + KV_read/(BW*eta_kv))

A preset with ``eta_attn > 0`` runs attention as a kernel of its own, after the GEMMs:

    T = c_step + c_layer*L + (c_req + c_req_layer*L)*B
        + roof(GEMM FLOPs/(peak*eta_c), W/(BW*eta_w)) + roof(attention FLOPs/(peak*eta_attn),
                                                            KV_read/(BW*eta_kv))

where ``roof`` is max() for ``ridge_frac = 0`` and otherwise the hyperbola
``(a + b + sqrt((a - b)^2 + 4 ridge_frac^2 a b)) / 2``: (1 + ridge_frac) x either roof at the
ridge, the larger roof plus ridge_frac^2 of the smaller far from it, and a + b at ridge_frac 1
(real kernels do not reach both roofs at once). `calibrate` fits the terms to a server's log or
to a GPU profile (docs/fidelity.md, "Clock").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from topas_bench.runners.sim.preset import KV_DTYPE_BYTES as KV_DTYPE_BYTES
from topas_bench.runners.sim.preset import Efficiency as Efficiency
from topas_bench.runners.sim.preset import GpuSpec as GpuSpec
from topas_bench.runners.sim.preset import ModelSpec as ModelSpec
from topas_bench.runners.sim.preset import Preset as Preset
from topas_bench.runners.sim.preset import is_preset_path as is_preset_path
from topas_bench.runners.sim.preset import load_preset as load_preset
from topas_bench.runners.sim.preset import load_preset_file as load_preset_file
from topas_bench.runners.sim.preset import preset_names as preset_names
from topas_bench.runners.sim.preset import preset_toml as preset_toml


class CostModel:
    """Iteration durations (seconds) of one engine on one preset; pure and stateless.

    Counts, per iteration: linear FLOPs ``2 * N_params`` per new token (with the model's
    vocabulary split out: none for the embedding lookup, the LM head once per request);
    causal attention FLOPs ``4 * n_q_heads * head_dim * n_layers`` per (new token, attended
    position) pair, the token itself included; weights read once (the embedding table not); the
    KV of every token in the batch's contexts (cached and new) read once.
    """

    def __init__(self, preset: Preset) -> None:
        self.preset = preset
        g, m, e = preset.gpu, preset.model, preset.efficiency
        flops_per_s = g.peak_tflops * 1e12 * e.eta_c
        per_token_params = m.params_b - m.embedding_params_b - m.lm_head_params_b
        self._lin_s = 2.0 * per_token_params * 1e9 / flops_per_s  # per new token
        self._head_s = 2.0 * m.lm_head_params_b * 1e9 / flops_per_s  # per request
        self._own_attn = e.eta_attn > 0
        attn_flops_per_s = g.peak_tflops * 1e12 * e.eta_attn if self._own_attn else flops_per_s
        self._attn_s = 4.0 * m.n_q_heads * m.head_dim * m.n_layers / attn_flops_per_s  # per pair
        streamed_gb = m.weight_gb * (1.0 - m.embedding_params_b / m.params_b)
        self._weight_s = streamed_gb * 1e9 / (g.hbm_tbps * 1e12 * e.eta_w)
        self._kv_s = preset.kv_bytes_per_token / (g.hbm_tbps * 1e12 * e.eta_kv)  # per token
        self._fixed_s = (e.c_step_us + e.c_layer_us * m.n_layers) * 1e-6
        self._req_s = (e.c_req_us + e.c_req_layer_us * m.n_layers) * 1e-6
        self._ridge_k = 4.0 * e.ridge_frac * e.ridge_frac
        self._host_s = preset.kv_bytes_per_token / (g.host_link_gbps * 1e9)

    def _roof(self, compute_s: float, memory_s: float) -> float:
        if not self._ridge_k:
            return max(compute_s, memory_s)
        d = compute_s - memory_s
        root = math.sqrt(d * d + self._ridge_k * compute_s * memory_s)
        return (compute_s + memory_s + root) * 0.5

    def _roofs(
        self, compute: npt.NDArray[np.float64], memory: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """`_roof` elementwise, in the same operation order (so element i is bit-identical);
        overwrites ``compute`` and returns it."""
        if not self._ridge_k:
            return np.maximum(compute, memory, out=compute)
        d = compute - memory
        d *= d
        both = self._ridge_k * compute
        both *= memory
        d += both
        np.sqrt(d, out=d)
        compute += memory
        compute += d
        compute *= 0.5
        return compute

    def _iteration_s(self, batch: int, new: int, pairs: int, context: int) -> float:
        lin_s = self._lin_s * new + self._head_s * batch
        if self._own_attn:
            roofs = self._roof(lin_s, self._weight_s) + self._roof(
                self._attn_s * pairs, self._kv_s * context
            )
        else:
            compute_s = lin_s + self._attn_s * pairs
            memory_s = self._weight_s + self._kv_s * context
            roofs = self._roof(compute_s, memory_s)
        return self._fixed_s + self._req_s * batch + roofs

    def prefill_s(self, items: Sequence[tuple[int, int]]) -> float:
        """One prefill (extend) iteration; ``items`` are ``(cached_tokens, new_tokens)`` each."""
        if not items:
            raise ValueError("a prefill iteration needs at least one request")
        new = pairs = context = 0
        for cached, fresh in items:
            new += fresh
            pairs += fresh * cached + fresh * (fresh + 1) // 2
            context += cached + fresh
        return self._iteration_s(len(items), new, pairs, context)

    def prefill_token_s(self, tokens: int) -> float:
        """One prefill of ``tokens`` uncached tokens for a single request."""
        return self.prefill_s([(0, tokens)])

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode iteration: ``batch`` requests each produce one token.

        ``context_tokens`` is the sum of their contexts *including* the token being produced,
        so each new token attends to exactly its context and this equals
        ``prefill_s([(c, 1) for each request])`` with ``c`` its context minus one.
        """
        return self._iteration_s(batch, batch, context_tokens, context_tokens)

    def decode_steps_s(
        self, batch: int, context_tokens: int, steps: int
    ) -> npt.NDArray[np.float64]:
        """Durations of ``steps`` consecutive decode iterations of a fixed batch.

        The summed context grows by ``batch`` per step; element ``i`` equals
        ``decode_step_s(batch, context_tokens + i * batch)`` exactly (bit for bit). The
        simulator's hot path: a few arrays, in-place arithmetic in the same operation order as
        `_iteration_s`.
        """
        context = np.arange(steps, dtype=np.float64)
        context *= batch
        context += context_tokens
        lin_s = self._lin_s * batch + self._head_s * batch
        compute = context * self._attn_s
        context *= self._kv_s
        if self._own_attn:
            roofs = self._roofs(compute, context)
            roofs += self._roof(lin_s, self._weight_s)
        else:
            compute += lin_s
            context += self._weight_s
            roofs = self._roofs(compute, context)
        roofs += self._fixed_s + self._req_s * batch
        return roofs

    def least_call_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """A lower bound on any call's time from ready to finish: each output token needs an
        iteration of its own, which costs at least a batch-of-one decode step over the call's
        context at that token (`_iteration_s` grows in every argument). Equals
        ``decode_steps_s(1, prompt_tokens, output_tokens).sum()``, in closed form where there
        is one: with attention a kernel of its own, its roof over a context c is c times its
        roof over one token (both roofs are proportional to c); on the original single
        roofline, the larger of two lines in the context, or their hyperbola (summed)."""
        lo, n = prompt_tokens, output_tokens
        if n <= 0:
            return 0.0
        fixed = n * (self._fixed_s + self._req_s)
        lin = self._lin_s + self._head_s
        if self._own_attn:
            per_token = self._roof(self._attn_s, self._kv_s)
            contexts = (2 * lo + n - 1) * n / 2  # the sum of lo .. lo + n - 1
            return fixed + n * self._roof(lin, self._weight_s) + per_token * contexts
        if self._ridge_k:
            return float(self.decode_steps_s(1, lo, n).sum())
        attn, weight, kv = self._attn_s, self._weight_s, self._kv_s
        # memory >= compute for contexts below `cross` when attn > kv (above it otherwise)
        slope = attn - kv
        cross = (weight - lin) / slope if slope else (math.inf if weight >= lin else -math.inf)
        below = (
            min(max(math.ceil(cross) - lo, 0), n)
            if math.isfinite(cross)
            else (n if cross > 0 else 0)
        )
        mem_first = slope >= 0  # memory bound for the smaller contexts

        def line(a: float, b: float, first: int, count: int) -> float:  # sum of a + b c
            return count * a + b * (2 * first + count - 1) * count / 2 if count else 0.0

        low = (weight, kv) if mem_first else (lin, attn)
        high = (lin, attn) if mem_first else (weight, kv)
        return fixed + line(*low, lo, below) + line(*high, lo + below, n - below)

    def host_load_s(self, tokens: int) -> float:
        """Copy ``tokens`` of KV from host memory back to the GPU (HiCache-like tier)."""
        return tokens * self._host_s
