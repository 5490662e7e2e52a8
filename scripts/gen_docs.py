"""Rewrite the generated tables of README.md and docs/evaluation.md from the committed result
files (`topas_bench.analysis.docgen`), or check that they are current.

    python scripts/gen_docs.py            # rewrite every generated block in place
    python scripts/gen_docs.py --check    # exit 1, naming each file, when a block is stale

A generated block is `<!-- generated: NAME key=value ... -->` ... `<!-- /generated -->`; the
names and their arguments are `docgen.BLOCKS`. tests/test_docgen.py runs the check.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from topas_bench.analysis.docgen import DOCS, render
from topas_bench.errors import TopasError

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="report stale blocks, change nothing")
    ap.add_argument("files", nargs="*", type=Path, help=f"default: {', '.join(DOCS)}")
    a = ap.parse_args()
    stale = []
    for path in a.files or [ROOT / d for d in DOCS]:
        try:
            old = path.read_text()
            new = render(old, ROOT)
        except (OSError, TopasError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            return 2
        if new == old:
            continue
        if a.check:
            stale.append(path)
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), str(path),
                                        "generated", lineterm="", n=0)  # fmt: skip
            print("\n".join(list(diff)[:40]))
        else:
            path.write_text(new)
            print(f"rewrote {path}")
    if stale:
        print(f"stale: {', '.join(str(p) for p in stale)} (python scripts/gen_docs.py)",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
