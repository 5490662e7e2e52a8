"""Every registered scheduler's answer to its parameters, one line a probe: its default
`params`; each parameter given each of `VALUES` alone (the `params` it then reports, or the
error); an unknown name given each of them; every parameter at once given a string.

Run it at two revisions and diff the outputs to see that a change to how policies take their
parameters changed no default, no accepted value and no error text (docs/design.md, issue 34):

    python scripts/param_probe.py > after.txt            # a line a probe, then the count
    PYTHONPATH=OTHER/src python scripts/param_probe.py > before.txt
    diff before.txt after.txt
"""

from __future__ import annotations

from typing import Any

from topas_bench.schedulers.registry import SCHEDULERS, make_policy

#: Values each parameter is given: in range, out of range, of the wrong type, not finite.
VALUES: tuple[Any, ...] = (
    None, -1, 0, 0.5, 1, 2, 3, 10, 1e9, -1e9, -0.5, float("nan"), float("inf"), True, False,
    "x", "fcfs", "1", [], {},
)  # fmt: skip


def answer(name: str, params: dict[str, Any]) -> str:
    """What building `name` with `params` gives: its `params`, or the error's type and text."""
    try:
        return f"ok {make_policy(name, **params).params}"
    except Exception as e:  # every error is an answer here, its text included
        return f"ERR {type(e).__name__}: {e}"


def probes() -> list[str]:
    out = []
    for name in SCHEDULERS.names():
        default = answer(name, {})
        out.append(f"{name} default {default}")
        if not default.startswith("ok "):
            continue
        keys = list(make_policy(name).params)
        for key in [*keys, "bogus"]:
            out += [f"{name} {key}={v!r} {answer(name, {key: v})}" for v in VALUES]
        out.append(f"{name} all='x' {answer(name, dict.fromkeys(keys, 'x'))}")
    return out


def main() -> None:
    lines = probes()
    print("\n".join(lines))
    print(f"{len(lines)} probes")


if __name__ == "__main__":
    main()
