"""Apply hand-made mutations one at a time in /tmp/mut, run the covering tests, record the outcome."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("MUT_ROOT", "/tmp/mut"))  # a scratch clone, never the working tree


def load(spec_file: str) -> Any:
    spec = importlib.util.spec_from_file_location("muts", spec_file)
    assert spec is not None and spec.loader is not None, spec_file
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def apply(src: str, old: str, new: str, occurrence: int) -> str:
    count = src.count(old)
    if count == 0:
        raise SystemExit(f"mutation target not found: {old!r}")
    if occurrence == 0 and count != 1:
        raise SystemExit(f"ambiguous target ({count} hits): {old!r}")
    idx = -1
    for _ in range(max(occurrence, 1)):
        idx = src.index(old, idx + 1)
    return src[:idx] + new + src[idx + len(old) :]


def main() -> None:
    spec_file, out_file = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3:])
    mod = load(spec_file)
    files = {m.get("file", mod.FILE) for m in mod.MUTATIONS} | {mod.FILE}
    originals = {f: (ROOT / f).read_text() for f in files}
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    results = []
    try:
        for m in mod.MUTATIONS:
            mid, old, new = m["id"], m["old"], m["new"]
            if only and mid not in only:
                continue
            path = ROOT / m.get("file", mod.FILE)  # a mutant may name another file
            original = originals[m.get("file", mod.FILE)]
            mutated = apply(original, old, new, m.get("occ", 0))
            assert mutated != original
            path.write_text(mutated)
            tests = os.environ.get("EXTRA_TESTS", "").split() + m.get("tests", mod.TESTS)
            cmd = [
                "timeout",
                str(m.get("timeout", getattr(mod, "TIMEOUT", 240))),
                sys.executable,
                "-m",
                "pytest",
                *tests,
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                "--hypothesis-seed=0",
            ]
            subprocess.run(["rm", "-rf", str(ROOT / ".hypothesis")])
            t0 = time.time()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            dt = time.time() - t0
            out = proc.stdout + proc.stderr
            failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
            if proc.returncode == 0:
                status, by = "survived", ""
            elif proc.returncode == 124:
                status, by = "killed", "timeout"
            else:
                status, by = "killed", failed[0] if failed else f"rc={proc.returncode}"
            rec = dict(id=mid, desc=m["desc"], status=status, by=by, seconds=round(dt, 1))
            results.append(rec)
            print(json.dumps(rec), flush=True)
            path.write_text(original)
    finally:
        for f, text in originals.items():
            (ROOT / f).write_text(text)
        subprocess.run(["git", "-C", str(ROOT), "checkout", "--", *sorted(files)])
        with open(out_file, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
