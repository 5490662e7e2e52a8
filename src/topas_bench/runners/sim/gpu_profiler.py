"""`topas-bench profile`: time whole prefill and decode iterations of a preset's model shape on
this machine, and write an iteration profile (docs/gpu.md, "The iteration profile format") that
`topas-bench calibrate --profile` fits.

The model is a dense decoder with grouped-query attention built from torch operations, with
random weights (nothing is downloaded): per layer an RMSNorm, the fused QKV GEMM, rotary
embeddings, the new tokens' K and V written into a per-layer pool, attention, the output GEMM,
an RMSNorm, the fused gate/up GEMM, SiLU x up and the down GEMM; then the final norm and the LM
head on each request's last token. A prefill request ``(cached, new)`` runs one attention
kernel over its cached and new tokens with a lower-right causal mask (SGLang's extend); a
decode step of B requests over c cached tokens each runs one batched kernel. On CUDA each
iteration is timed eagerly and as a replayed CUDA graph (the GPU's own time), and the GEMM and
copy peak checks are measured first; on a CPU (``--tiny``: a code-path check) eagerly, in
float32. torch is imported here only: it is not a dependency of the project.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.sim.cost import Preset

Items = list[tuple[int, int]]


@dataclass(frozen=True)
class Shape:
    """A model's dimensions (what the profiler builds)."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False

    @property
    def params(self) -> int:
        """Parameters of the weights built (norms aside)."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate
        return self.layers * layer + (1 if self.tied else 2) * self.vocab * self.hidden

    @classmethod
    def from_preset(cls, preset: Preset, vocab: int | None = None) -> Shape:
        """The preset's model: hidden = heads x head_dim, the vocabulary from its LM head (or
        ``vocab``), the MLP width from the parameters left after attention (to 128)."""
        m = preset.model
        hidden = m.hidden
        vocab = vocab or round(m.lm_head_params_b * 1e9 / hidden)
        if not vocab:
            raise TopasError(
                f"preset {preset.name!r} does not split out its vocabulary "
                "(model.lm_head_params_b): give --vocab"
            )
        tied = m.lm_head_params_b > 0 and m.embedding_params_b == 0
        matrices = (1 if tied else 2) * vocab * hidden
        per_layer = (m.params_b * 1e9 - matrices) / m.n_layers
        attn = (
            hidden * (m.n_q_heads + 2 * m.n_kv_heads) * m.head_dim
            + m.n_q_heads * m.head_dim * hidden
        )
        inter = round((per_layer - attn) / (3 * hidden) / 128) * 128
        if inter <= 0:
            raise TopasError(f"preset {preset.name!r}: its parameters leave no MLP")
        name = preset.name.split("@")[0]
        return cls(
            name, m.n_layers, hidden, m.n_q_heads, m.n_kv_heads, m.head_dim, inter, vocab, tied
        )


TINY = Shape("tiny", 2, 64, 4, 2, 16, 128, 256)


def grid(tiny: bool) -> tuple[list[Items], list[tuple[int, int]]]:
    """Prefill batches and decode (batch, context) points: the shared H200 profile's grid."""
    if tiny:
        pre = [[(0, 16)], [(0, 64)], [(32, 16)], [(128, 32)], [(64, 8)] * 3, [(16, 16)] * 2]
        return pre, [(b, c) for c in (8, 64) for b in (1, 2, 4, 8)]
    singles = [[(p, n)] for n in (128, 512, 2048, 8192) for p in (0, 2048, 8192, 32768)]
    multis = [[(4096, 256)] * k for k in (2, 8, 32)] + [[(1024, 1024)] * k for k in (4, 16)]
    batches = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    return singles + multis, [(b, c) for c in (512, 2048, 8192) for b in batches]


class _Model:
    def __init__(self, shape: Shape, device: str, dtype: Any, pool_tokens: int) -> None:
        import torch  # type: ignore[import-not-found]

        self.torch, self.s, self.dev = torch, shape, device
        gen = torch.Generator(device=device).manual_seed(0)
        s = shape

        def rand(*size: int) -> Any:
            return torch.randn(*size, device=device, dtype=dtype, generator=gen) * 0.02

        self.embed = rand(s.vocab, s.hidden)
        self.head = self.embed if s.tied else rand(s.vocab, s.hidden)
        q, kv = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = [
            {"qkv": rand(q + 2 * kv, s.hidden), "o": rand(s.hidden, q),
             "up": rand(2 * s.intermediate, s.hidden), "down": rand(s.hidden, s.intermediate),
             "n1": torch.ones(s.hidden, device=device, dtype=dtype),
             "n2": torch.ones(s.hidden, device=device, dtype=dtype)}
            for _ in range(s.layers)
        ]  # fmt: skip
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.k = [rand(pool_tokens, s.kv_heads, s.head_dim) for _ in range(s.layers)]
        self.v = [rand(pool_tokens, s.kv_heads, s.head_dim) for _ in range(s.layers)]
        half = s.head_dim // 2
        inv = 1.0 / 10000 ** (torch.arange(half, device=device, dtype=torch.float32) / half)
        angles = torch.outer(torch.arange(pool_tokens, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def rope(self, x: Any, pos: Any) -> Any:
        a, b = x.chunk(2, dim=-1)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        return self.torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def inputs(self, items: Items) -> dict[str, Any]:
        """Index tensors of one iteration (made before timing or capture). Request j's context
        lives at pool rows [start_j, start_j + cached + new)."""
        torch, starts, at = self.torch, [], 0
        for c, n in items:
            starts.append(at)
            at += c + n
        new = [(st + c, n, c) for st, (c, n) in zip(starts, items, strict=True)]
        ids = torch.arange(sum(n for _, n in items)) % self.s.vocab
        pos = torch.cat([torch.arange(c, c + n) for _, n, c in new])
        rows = torch.cat([torch.arange(r, r + n) for r, n, _ in new])
        last = torch.cumsum(torch.tensor([n for _, n in items]), 0) - 1
        t = {
            k: v.to(self.dev)
            for k, v in (("ids", ids), ("pos", pos), ("rows", rows), ("last", last))
        }
        return {**t, "items": items, "starts": starts}

    def forward(self, x_in: dict[str, Any], decode: bool) -> Any:
        torch, s = self.torch, self.s
        F = torch.nn.functional
        items, starts = x_in["items"], x_in["starts"]
        x = self.embed[x_in["ids"]]
        q_n, kv_n = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        for i, w in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), w["n1"])
            q, k, v = (h @ w["qkv"].t()).split((q_n, kv_n, kv_n), dim=-1)
            q = self.rope(q.view(-1, s.q_heads, s.head_dim), x_in["pos"])
            k = self.rope(k.view(-1, s.kv_heads, s.head_dim), x_in["pos"])
            self.k[i].index_copy_(0, x_in["rows"], k)
            self.v[i].index_copy_(0, x_in["rows"], v.view(-1, s.kv_heads, s.head_dim))
            if decode:
                attn = self._decode_attention(i, q, items[0][0] + 1, len(items))
            else:
                attn = torch.cat([
                    self._extend_attention(i, q, st, c, n, sum(m for _, m in items[:j]))
                    for j, (st, (c, n)) in enumerate(zip(starts, items, strict=True))
                ])  # fmt: skip
            x = x + attn.reshape(-1, q_n) @ w["o"].t()
            h = F.rms_norm(x, (s.hidden,), w["n2"])
            gate, up = (h @ w["up"].t()).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["down"].t()
        return F.rms_norm(x[x_in["last"]], (s.hidden,), self.norm) @ self.head.t()

    def _extend_attention(self, i: int, q: Any, start: int, cached: int, new: int, at: int) -> Any:
        from torch.nn.attention.bias import causal_lower_right  # type: ignore[import-not-found]

        ctx = cached + new
        qs = q[at : at + new].transpose(0, 1).unsqueeze(0)  # (1, heads, new, d)
        ks = self.k[i][start : start + ctx].transpose(0, 1).unsqueeze(0)
        vs = self.v[i][start : start + ctx].transpose(0, 1).unsqueeze(0)
        out = _sdpa(self.torch, qs, ks, vs, causal_lower_right(new, ctx))
        return out.squeeze(0).transpose(0, 1)

    def _decode_attention(self, i: int, q: Any, ctx: int, batch: int) -> Any:
        s = self.s
        ks = self.k[i][: batch * ctx].view(batch, ctx, s.kv_heads, s.head_dim).transpose(1, 2)
        vs = self.v[i][: batch * ctx].view(batch, ctx, s.kv_heads, s.head_dim).transpose(1, 2)
        out = _sdpa(self.torch, q.view(batch, s.q_heads, 1, s.head_dim), ks, vs, None)
        return out.transpose(1, 2)


def _sdpa(torch: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:
    """Attention with K/V heads shared by their query group (no copies) where torch can; else
    K/V repeated to the query heads."""
    F = torch.nn.functional
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    except (RuntimeError, TypeError, NotImplementedError):
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _timed(torch: Any, fn: Callable[[], Any], cuda: bool, reps: int, warm: int = 2) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(float(a.elapsed_time(b)))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def _graph_timed(torch: Any, fn: Callable[[], Any], reps: int) -> list[float]:
    """Capture ``fn`` as a CUDA graph and time its replays (no Python launch cost)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _timed(torch, graph.replay, True, reps)


def _anchors(torch: Any) -> list[dict[str, Any]]:
    """The GPU's peak checks: an 8192^3 BF16 GEMM and a 4 GiB device-to-device copy."""

    def gemm(n: int = 8192) -> dict[str, Any]:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        ms = statistics.median(_timed(torch, lambda: a @ b, True, 10, warm=3))
        return {
            "kind": "anchor",
            "what": f"bf16 gemm {n}^3",
            "ms": ms,
            "tflops": 2 * n**3 / ms / 1e9,
        }

    def copy(gib: int = 4) -> dict[str, Any]:
        src = torch.empty(gib * 1024**3 // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        ms = statistics.median(_timed(torch, lambda: dst.copy_(src), True, 10, warm=3))
        tbps = 2 * gib * 1024**3 / ms / 1e9  # bytes read and written
        return {"kind": "anchor", "what": f"d2d copy {gib} GiB", "ms": ms, "tbps_rw": tbps}

    rows = [gemm(), copy()]
    torch.cuda.empty_cache()
    return rows


def profile(
    shape: Shape,
    out: Path,
    device: str = "cuda",
    graphs: bool = True,
    reps: int = 5,
    points: tuple[Sequence[Items], Sequence[tuple[int, int]]] | None = None,
    echo: Callable[[str], None] = print,
) -> int:
    """Measure the grid (``points``, default `grid`) and write the profile to ``out``; the
    number of points timed. A point that fails (out of memory) is written with its error."""
    try:
        import torch
    except ImportError:
        raise TopasError(
            "topas-bench profile needs torch (on a GPU machine, its CUDA build): pip install torch"
        ) from None
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise TopasError("no CUDA device: run on a GPU machine, or pass --tiny for the CPU check")
    dtype = torch.bfloat16 if cuda else torch.float32
    prefills, decodes = points or grid(shape == TINY)
    need = max([sum(c + n for c, n in it) for it in prefills] + [b * (c + 1) for b, c in decodes])
    elem = 2 if cuda else 4
    kv_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * elem
    if cuda:  # the KV pool takes 60% of what the weights leave; the rest is for activations
        room = torch.cuda.mem_get_info()[0] - shape.params * elem
        pool = min(need, int(0.6 * room / kv_bytes))
        if pool <= 0:
            raise TopasError(f"{shape.name}: the weights ({shape.params * elem / 1e9:.1f} GB) "
                             "leave no room on this GPU")  # fmt: skip
    else:
        pool = need
    timed = 0
    with out.open("w") as f:

        def emit(line: dict[str, Any]) -> None:
            f.write(json.dumps(line) + "\n")
            f.flush()
            echo(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                             for k, v in line.items() if not k.endswith("_all")}))  # fmt: skip

        emit({"kind": "info", "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")})  # fmt: skip
        for anchor in _anchors(torch) if cuda else []:
            emit(anchor)
        model = _Model(shape, device, dtype, pool)
        emit({"kind": "shape", "model": shape.name, **asdict(shape), "pool_tokens": pool})
        cases = [("prefill", list(it)) for it in prefills]
        cases += [("decode", [(c, 1)] * b) for b, c in decodes]
        for kind, items in cases:
            if sum(c + n for c, n in items) > pool:
                continue
            row: dict[str, Any] = {"model": shape.name, "kind": kind, "batch": len(items)}
            if kind == "prefill":
                row.update(items=[list(it) for it in items], new_tokens=sum(n for _, n in items),
                           cached_tokens=sum(c for c, _ in items))  # fmt: skip
            else:
                c = items[0][0]
                row.update(items=[[c, 1]], context=c, context_tokens=len(items) * (c + 1))
            try:
                with torch.inference_mode():
                    x_in = model.inputs(items)
                    fn = partial(model.forward, x_in, kind == "decode")
                    ms = _timed(torch, fn, cuda, reps)
                    row.update(ms=statistics.median(ms), ms_all=ms)
                    if cuda and graphs:
                        gms = _graph_timed(torch, fn, reps)
                        row.update(graph_ms=statistics.median(gms), graph_ms_all=gms)
                timed += 1
            except Exception as e:  # a failed point is written, the rest go on
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                if cuda:
                    torch.cuda.empty_cache()
            emit(row)
    return timed
