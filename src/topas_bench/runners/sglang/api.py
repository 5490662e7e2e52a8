"""The OpenAI-compatible server as the client reaches it: through the `openai` package.

One `AsyncOpenAI` per run (`connect`): it pools connections, applies its own timeouts, and
retries what fails before an answer starts (connection errors, HTTP 408/409/429/5xx) with
exponential backoff and jitter, `retries` times. `/v1/completions` and `/v1/models` are its
API; SGLang's and vLLM's `/tokenize` (outside `/v1`) goes through the same client's generic
`post` on the server's root. `openai` is imported here only (the `client` extra).

Errors: `TransientError` for what a later attempt may fix (the connection lost mid-stream, a
stream cut before its usage block, a timeout, or the failures above once openai's own retries
are spent); `RequestError` for the rest (HTTP 4xx, unusable answers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topas_bench.errors import TopasError

if TYPE_CHECKING:
    from openai import AsyncOpenAI


class RequestError(TopasError):
    """A request the server refused or answered with something unusable."""


class TransientError(RequestError):
    """A failure a retry may fix: connection trouble, a timeout, HTTP 429 or 5xx."""


def _openai() -> Any:
    try:
        import openai
    except ImportError:
        raise TopasError(
            "the sglang engine's client needs the openai package: pip install 'topas-bench[client]'"
        ) from None
    return openai


def connect(base_url: str, *, timeout_s: float = 600.0, retries: int = 2) -> AsyncOpenAI:
    """A client of the server at `base_url` (its root, without `/v1`)."""
    client: AsyncOpenAI = _openai().AsyncOpenAI(
        base_url=f"{base_url.rstrip('/')}/v1", api_key="none", timeout=timeout_s,
        max_retries=retries,
    )  # fmt: skip
    return client


def classify(e: BaseException, url: str) -> RequestError:
    """`e` (from openai, or from its HTTP stack mid-stream) as one of ours."""
    openai = _openai()
    if isinstance(e, RequestError):
        return e
    if isinstance(e, openai.APIStatusError):
        message = f"{url}: HTTP {e.status_code}: {_body(e)}"
        transient = e.status_code in (408, 409, 429) or e.status_code >= 500
        return TransientError(message) if transient else RequestError(message)
    if isinstance(e, openai.APITimeoutError | TimeoutError):
        return TransientError(f"{url}: timed out")
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e.__context__
        why = f"{type(cause).__name__}: {cause}" if cause else str(e)
        return TransientError(f"cannot connect to {url} ({why})")
    stack = type(e).__module__.split(".")[0]
    if isinstance(e, OSError) or stack in ("httpx", "httpx2", "httpcore", "httpcore2", "h11"):
        return TransientError(f"{url}: connection lost ({type(e).__name__}: {e})")
    if isinstance(e, openai.APIError):
        return RequestError(f"{url}: {e}")
    raise e


def _body(e: Any) -> str:
    body = getattr(e, "body", None)
    return str(body if body is not None else e.message)[:300]


async def served_model(client: AsyncOpenAI) -> str:
    """The first model the server lists (`/v1/models`)."""
    url = f"{client.base_url}models"
    try:
        page = await client.models.list()
    except Exception as e:
        raise classify(e, url) from None
    if not page.data:
        raise RequestError(f"{url} lists no model")
    return str(page.data[0].id)


async def tokenize(client: AsyncOpenAI, model: str, text: str, add_special_tokens: bool) -> int:
    """Tokens of `text` by the server's own tokenizer (`/tokenize`, SGLang and vLLM)."""
    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    body = {"model": model, "prompt": text, "add_special_tokens": add_special_tokens}
    try:
        ans = await client.with_options(base_url=root).post("/tokenize", body=body, cast_to=object)
    except Exception as e:
        raise classify(e, f"{root}/tokenize") from None
    if not isinstance(ans, dict) or not isinstance(ans.get("count"), int):
        raise RequestError(f"{root}/tokenize answered without a count: {ans!r:.200}")
    return int(ans["count"])
