"""Run MetaGPT in its own venv with our hook and record every LLM call (`trace record`).

MetaGPT 0.8.2 lives in ``.venvs/metagpt`` (``make metagpt-env``; never beside the project, its
pins conflict with ours). `record` checks the server, writes a private MetaGPT work directory
(``config/config2.yaml`` with ``api_type: open_llm``; ``METAGPT_PROJECT_ROOT`` and ``HOME``
point there, so no user config leaks in), and runs `hook.py` there as a child process. The hook
writes one JSONL line per finished call, so an interrupted or failed run keeps what it recorded.

The TeamLeader workflow exists only on MetaGPT's GitHub main branch, in no PyPI release:
``--workflow tl`` needs ``--metagpt-src`` pointing at a checkout of it, which the hook puts first
on ``sys.path``, and runs in its own venv, ``.venvs/metagpt-main`` (``make metagpt-main-env``:
main's dependency set, which 0.8.2's pins do not satisfy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from topas_bench.errors import TopasError

HOOK = Path(__file__).with_name("hook.py")
#: Override where the MetaGPT venv of each workflow is looked for.
VENV_ENV = "TOPAS_METAGPT_VENV"
MAIN_VENV_ENV = "TOPAS_METAGPT_MAIN_VENV"
WORKFLOWS = ("sop", "tl")
#: per workflow: (venv directory under .venvs, its override variable, the make target building it)
VENVS = {
    "sop": ("metagpt", VENV_ENV, "make metagpt-env"),
    "tl": ("metagpt-main", MAIN_VENV_ENV, "make metagpt-main-env"),
}


@dataclass(frozen=True)
class Recording:
    out: Path
    calls: int
    log: Path
    workdir: Path


def metagpt_python(venv: Path | None = None, workflow: str = "sop") -> Path:
    """The python of `workflow`'s MetaGPT venv: `venv`, else the workflow's override variable
    ($TOPAS_METAGPT_VENV for sop, $TOPAS_METAGPT_MAIN_VENV for tl), else .venvs/metagpt (sop) or
    .venvs/metagpt-main (tl) in this checkout or the current directory."""
    name, env_var, make = VENVS[workflow]
    candidates = [venv] if venv is not None else []
    if not candidates and os.environ.get(env_var):
        candidates = [Path(os.environ[env_var])]
    if not candidates:
        repo = Path(__file__).resolve().parents[3]  # src/topas_bench/recorder/record.py
        candidates = [repo / ".venvs" / name, Path.cwd() / ".venvs" / name]
    for c in candidates:
        python = c / "bin" / "python"
        if python.exists():
            return python
    where = ", ".join(str(c) for c in candidates)
    what = "MetaGPT venv" if workflow == "sop" else "MetaGPT main venv (for --workflow tl)"
    raise TopasError(f"no {what} at {where}; build it with `{make}`")


def check_server(base_url: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the URL, when nothing answers at `base_url` (any HTTP reply will do)."""
    url = base_url.rstrip("/") + "/models"
    if not url.startswith(("http://", "https://")):
        raise TopasError(f"--base-url must be an http(s) URL, got {base_url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TopasError(f"cannot reach the LLM server at {base_url}: {reason}") from None


def check_metagpt_src(src: Path | None) -> Path:
    if src is None:
        raise TopasError(
            "--workflow tl needs --metagpt-src DIR, a checkout of MetaGPT's main branch: the "
            "TeamLeader workflow is in no PyPI release"
        )
    if not (src / "metagpt" / "roles" / "di" / "team_leader.py").is_file():
        raise TopasError(
            f"{src}: no metagpt/roles/di/team_leader.py; --metagpt-src must be a checkout of "
            "MetaGPT's main branch (the TeamLeader code is in no PyPI release)"
        )
    return src.resolve()


def write_config(workdir: Path, base_url: str, model: str, api_key: str) -> Path:
    """MetaGPT's config2.yaml (JSON strings are valid YAML scalars)."""
    path = workdir / "config" / "config2.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    llm = {"api_type": "open_llm", "base_url": base_url, "api_key": api_key, "model": model}
    path.write_text("llm:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in llm.items()))
    return path


def record(
    *,
    workflow: str,
    idea: str,
    base_url: str,
    model: str,
    out: Path,
    api_key: str = "sk-none",
    keep_text: bool = False,
    run_tests: bool = False,
    metagpt_src: Path | None = None,
    venv: Path | None = None,
    workdir: Path | None = None,
    timeout_s: float = 3600.0,
) -> Recording:
    """Run `workflow` on `idea` against `base_url` and record its calls into `out` (JSONL)."""
    if workflow not in WORKFLOWS:
        raise TopasError(f"--workflow must be one of {', '.join(WORKFLOWS)}, got {workflow!r}")
    if not idea.strip():
        raise TopasError("--idea is empty")
    src = check_metagpt_src(metagpt_src) if workflow == "tl" else None
    check_server(base_url)
    python = metagpt_python(venv, workflow)
    work = Path(tempfile.mkdtemp(prefix="topas-metagpt-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    write_config(work, base_url, model, api_key)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), str(HOOK), "--workflow", workflow, "--idea", idea, "--out", str(out)]
    cmd += ["--keep-text"] * keep_text + ["--run-tests"] * run_tests
    cmd += ["--metagpt-src", str(src)] if src is not None else []
    env = {**os.environ, "METAGPT_PROJECT_ROOT": str(work), "HOME": str(work)}
    log = work / "metagpt.log"
    with log.open("w") as log_file:
        child = subprocess.Popen(cmd, cwd=work, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            rc = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise TopasError(
                f"MetaGPT did not finish within {timeout_s:g} s; {_count(out)} calls kept in "
                f"{out}; log: {log}"
            ) from None
        except BaseException:  # Ctrl-C: stop the child, keep what it recorded
            child.terminate()
            child.wait()
            raise
    calls = _count(out)
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise TopasError(
            f"MetaGPT exited with status {rc}; {calls} calls kept in {out}; log: {log}\n{tail}"
        )
    if calls == 0:
        raise TopasError(f"MetaGPT made no LLM call; log: {log}")
    return Recording(out, calls, log, work)


def _count(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    except OSError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `topas-bench trace record`")
