"""A stand-in for `python -m sglang.launch_server` that speaks as much of SGLang's HTTP API as
sglang-router 0.3.2 and the workflow client need (the standard library and the project's
`request_log`): the CPU stand-in of the real-router tests (tests/test_sglang_router.py).

`shim(DIR)` writes DIR/sglang/launch_server.py running it; with DIR first on PYTHONPATH, the
project's launcher starts it as it would start SGLang. It answers what the router calls at
registration and health checks (`/health`, `/server_info`, `/model_info` and their `/get_*`
spellings, `/v1/models`), the client's `/tokenize` (one token per space-separated word, plus a
BOS), and streaming `/v1/completions`: `max_tokens` chunks, STUB_TOKEN_S seconds apart, then
the usage block. Like SGLang with the topas plugin, it prints the plugin's installed line. It
keeps a prefix cache of the prompts it served (in words, unbounded) and reports the hit as
`cached_tokens`; every chunk names the worker in `system_fingerprint` (its base URL; empty, as
SGLang leaves it, with STUB_FINGERPRINT=0), and with TOPAS_SCHEDULER set it prints the plugin's
line for each tagged request (`request_log`). Each
completion is logged as one JSON line in STUB_LOG_DIR/<port>.jsonl: receive and finish times,
the prompt, the task metadata (`custom_params`: task, stage, the task's arrival on the client's
clock), the tokens cached.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from topas_bench.runners.sglang import request_log

PORT = 0
MODEL = "stub-model"
URL = ""
TOKEN_S = 0.002
LOG_DIR: str | None = None
FINGERPRINT = True  # name the worker in `system_fingerprint` (SGLang does not: STUB_FINGERPRINT=0)
LOCK = threading.Lock()
SEEN: list[list[str]] = []  # prompts served, as words


def shim(directory: Path) -> Path:
    """Make `directory` hold a `sglang.launch_server` that runs this stub; returns it."""
    pkg = directory / "sglang"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(
        "from topas_bench.runners.sglang.stub_worker import main\n\nmain()\n"
    )
    return directory


def cached_words(words: list[str]) -> int:
    best = 0
    for old in SEEN:
        n = 0
        for a, b in zip(old, words, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, code: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        info = {"model_path": MODEL, "tokenizer_path": MODEL, "served_model_name": MODEL,
                "is_generation": True, "dp_size": 1, "tp_size": 1,
                "disaggregation_mode": "null", "version": "0.0.0-stub",
                "model_type": "llama", "architectures": ["LlamaForCausalLM"]}  # fmt: skip
        if path in ("/health", "/health_generate"):
            self.reply(200, {})
        elif path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            self.reply(200, info)
        elif path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        t_recv = time.time()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            n = len(body["prompt"].split()) + (1 if body.get("add_special_tokens", True) else 0)
            return self.reply(200, {"count": n, "tokens": list(range(n)), "max_model_len": 1 << 20})
        if self.path != "/v1/completions":
            return self.reply(404, {"error": "not found"})
        words = body["prompt"].split()
        meta = json.loads((body.get("custom_params") or {}).get("topas", "{}"))
        if os.environ.get("TOPAS_SCHEDULER") and isinstance(meta.get("task"), str):
            # what the topas plugin logs for a tagged request (`request_log`)
            print(request_log.line(meta["task"], str(meta.get("stage"))), file=sys.stderr,
                  flush=True)  # fmt: skip
        with LOCK:
            cached = cached_words(words)
            SEEN.append(words)
        n = int(body["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        base = {"id": "cmpl-stub", "object": "text_completion", "model": MODEL,
                "system_fingerprint": URL if FINGERPRINT else ""}  # fmt: skip
        for _ in range(n):
            time.sleep(TOKEN_S)
            chunk = {**base, "choices": [{"index": 0, "text": " x", "finish_reason": None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"prompt_tokens": len(words) + 1, "completion_tokens": n,
                 "total_tokens": len(words) + 1 + n,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        self.wfile.write(b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode())
        self.wfile.write(b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True
        if LOG_DIR:
            line = {"worker": URL, "t_recv": t_recv, "t_done": time.time(), "cached": cached,
                    "task": meta.get("task"), "stage": meta.get("stage"),
                    "arrival": meta.get("arrival"),
                    "prompt": body["prompt"]}  # fmt: skip
            with LOCK, open(os.path.join(LOG_DIR, f"{PORT}.jsonl"), "a") as f:
                f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Serve on `--port` (other launch_server arguments are ignored) until killed."""
    global PORT, MODEL, URL, TOKEN_S, LOG_DIR, FINGERPRINT
    args = sys.argv[1:] if argv is None else argv
    PORT = int(args[args.index("--port") + 1])
    MODEL = args[args.index("--model-path") + 1] if "--model-path" in args else "stub-model"
    URL = f"http://127.0.0.1:{PORT}"
    TOKEN_S = float(os.environ.get("STUB_TOKEN_S", "0.002"))
    LOG_DIR = os.environ.get("STUB_LOG_DIR")
    FINGERPRINT = os.environ.get("STUB_FINGERPRINT", "1") != "0"
    if os.environ.get("TOPAS_SCHEDULER"):  # what the topas plugin prints once installed
        print(f"topas: scheduler {os.environ['TOPAS_SCHEDULER']!r} installed", file=sys.stderr,
              flush=True)  # fmt: skip
    print(f"stub sglang worker on {URL}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()


if __name__ == "__main__":
    main()
