"""Fault injection for ``.fsp`` files: damaged files are refused, good ones never overwritten.

Three kinds of fault, each on a real sparse checkpoint (``mnist1d_cnn`` pruned
to 90 %, written by ``save_sparse`` with its model spec, as a run's
``model.fsp`` is):

- **bit flips**: one random bit of the file inverted — anywhere in the file,
  and (a second row) only within its two headers (the safetensors JSON and the
  xz-compressed feather header), where a flip would do the most harm;
- **truncations**: the file cut at a random length;
- **SIGKILL during export**: ``feather-sparse export SRC -o model.fsp`` killed
  at a random moment while it works, over an existing good ``model.fsp``.

For a damaged file, *detected* means ``load_sparse`` raised a one-line
``ValueError``/``OSError`` naming the file and ``feather-sparse export DAMAGED
-o model.fsp`` exited with code 1; *good files overwritten* counts the times
that good ``model.fsp`` changed. For SIGKILL, *detected* is the share of kills
after which ``model.fsp`` was whole (the old file or the complete new one);
temporary files are counted right after the kill and after the next export to
the same file (which removes those of killed writers).

The test suite runs the same functions (``tests/test_faults_export.py``).

Usage::

    PYTHONPATH=src python benchmarks/bench_faults_export.py [--cases 1000] [--kills 20] \
        [--seed 0] [--exhaustive]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import feather_sparse
from feather_sparse import Pruner, cli
from feather_sparse.export import load_sparse, load_sparse_state_dict, save_sparse
from feather_sparse.models import create_model

TMP_GLOB = ".model.fsp.*.tmp"  # the temporaries save_sparse writes beside model.fsp


@dataclass
class Row:
    """One line of the table."""

    fault: str
    cases: int
    detected: int
    overwritten: int
    temp_left: str = "–"
    note: str = ""
    writes: bool = True  # whether the fault was tried against a good model.fsp

    @property
    def share(self) -> float:
        return self.detected / self.cases if self.cases else 0.0


def make_source(folder: Path, model: str = "mnist1d_cnn", sparsity: float = 0.9) -> Path:
    """A pruned model saved as a ``.fsp`` with its spec (what ``model.fsp`` of a run is)."""
    torch.manual_seed(0)
    net = create_model(model)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1:
                k = int(sparsity * p.numel())
                p[p.abs() <= p.abs().flatten().kthvalue(k).values] = 0
    path = folder / f"{model}.fsp"
    save_sparse(net, path, metadata={"source": "bench_faults_export"})
    return path


def header_regions(data: bytes) -> list[tuple[int, int]]:
    """Byte ranges of the safetensors JSON header and of the feather header entry."""
    n = struct.unpack("<Q", data[:8])[0]
    table = json.loads(data[8 : 8 + n])
    start, end = table["feather.header"]["data_offsets"]
    return [(0, 8 + n), (8 + n + start, 8 + n + end)]


def check_damaged(damaged: Path, good: Path) -> tuple[bool, bool]:
    """Whether the damage was detected (API and CLI), and whether ``good`` was overwritten."""
    before = good.read_bytes()
    try:
        load_sparse(damaged)
        api = False
    except (ValueError, OSError) as err:
        message = str(err)
        api = "\n" not in message and damaged.name in message
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["export", str(damaged), "-o", str(good)])
    lines = stderr.getvalue().strip().splitlines()
    cli_ok = code == 1 and len(lines) == 1
    return api and cli_ok, good.read_bytes() != before


def _damage_runs(
    name: str,
    source: Path,
    cases: int,
    damage: Callable[[bytes], bytes],
) -> Row:
    folder = source.parent
    good = folder / "model.fsp"
    shutil.copyfile(source, good)
    damaged = folder / "damaged.fsp"
    data = source.read_bytes()
    row = Row(name, cases, 0, 0, note=f"{source.stat().st_size:,}-byte file")
    for _ in range(cases):
        damaged.write_bytes(damage(data))
        detected, overwritten = check_damaged(damaged, good)
        row.detected += detected
        row.overwritten += overwritten
    return row


def bit_flips(source: Path, cases: int, rng: random.Random, headers_only: bool = False) -> Row:
    """``cases`` files with one random bit inverted (anywhere, or within the headers)."""
    data = source.read_bytes()
    spans = header_regions(data) if headers_only else [(0, len(data))]
    positions = [i for lo, hi in spans for i in range(lo, hi)]

    def flip(data: bytes) -> bytes:
        out = bytearray(data)
        out[rng.choice(positions)] ^= 1 << rng.randrange(8)
        return bytes(out)

    name = "single-bit flip, in the headers" if headers_only else "single-bit flip, anywhere"
    return _damage_runs(name, source, cases, flip)


def truncations(source: Path, cases: int, rng: random.Random) -> Row:
    """``cases`` copies of the file cut at a random length (0 to size - 1 bytes)."""
    size = source.stat().st_size
    return _damage_runs("truncation", source, cases, lambda data: data[: rng.randrange(size)])


def make_small_source(folder: Path, pattern: str | None = None) -> Path:
    """A two-layer model small enough to damage in every possible way (about 2.6 kB).

    With ``pattern`` (``"2:4"``) the Linear weights are pruned to that N:M
    pattern by a finalized Pruner instead, so the file holds N:M records
    (format version 2).
    """
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    if pattern is None:
        with torch.no_grad():
            for p in net.parameters():
                p[p.abs() < 0.1] = 0
    else:
        Pruner(net, pattern=pattern).finalize()
    path = folder / ("small.fsp" if pattern is None else f"small-{pattern.replace(':', 'of')}.fsp")
    info = save_sparse(net, path)
    if pattern is not None and not any(r.nm_pattern for r in info.tensors):
        raise RuntimeError(f"{path} holds no N:M record")
    return path


def every_fault(source: Path, what: str = "two Linear layers") -> list[Row]:
    """Every single-bit flip and every truncation of ``source``, read with
    ``load_sparse_state_dict`` (the library only: the CLI runs above)."""
    data = source.read_bytes()
    damaged = source.parent / "damaged-small.fsp"

    def refused(content: bytes) -> bool:
        damaged.write_bytes(content)
        try:
            load_sparse_state_dict(damaged)
        except (ValueError, OSError) as err:
            return "\n" not in str(err)
        return False

    flips = Row("every single-bit flip (library)", 8 * len(data), 0, 0)
    for i in range(len(data)):
        for bit in range(8):
            out = bytearray(data)
            out[i] ^= 1 << bit
            flips.detected += refused(bytes(out))
    cuts = Row("every truncation (library)", len(data), 0, 0)
    cuts.detected = sum(refused(data[:n]) for n in range(len(data)))
    for row in (flips, cuts):
        row.note = f"{len(data):,}-byte file, {what}"
        row.writes = False
    return [flips, cuts]


def _child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(Path(feather_sparse.__file__).resolve().parents[1])
    return env


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, env=_child_env(), capture_output=True)
    return time.perf_counter() - start


def sigkill_during_export(source: Path, kills: int, rng: random.Random) -> Row:
    """Kill ``feather-sparse export SOURCE -o model.fsp --values fp16`` at random moments.

    The moment is drawn uniformly between the end of the interpreter's start-up
    (timed once: importing the CLI) and the end of an uninterrupted export, so
    the kills land while the command reads, encodes and writes.
    """
    folder = source.parent
    target = folder / "model.fsp"
    argv = [sys.executable, "-m", "feather_sparse", "export", str(source), "-o", str(target)]
    argv += ["--values", "fp16"]
    shutil.copyfile(source, target)
    old = target.read_bytes()
    startup = _timed([sys.executable, "-c", "import feather_sparse.cli"])
    full = _timed(argv)
    new_state = load_sparse(target).state_dict()
    row = Row("SIGKILL during export", kills, 0, 0)
    left_now = left_after = kept_old = finished = 0
    for _ in range(kills):
        target.write_bytes(old)
        child = subprocess.Popen(
            argv, env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(startup, full))
        finished += child.poll() is not None  # ran to the end: the kill changes nothing
        child.send_signal(signal.SIGKILL)
        child.wait()
        current = target.read_bytes()
        whole = current == old
        kept_old += whole
        if not whole:
            try:
                state = load_sparse(target).state_dict()
                whole = all(torch.equal(state[k], new_state[k]) for k in new_state)
            except (ValueError, OSError):
                whole = False
        row.detected += whole
        row.overwritten += not whole
        left_now += any(folder.glob(TMP_GLOB))
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(["export", str(source), "-o", str(target)])  # the next export
        left_after += any(folder.glob(TMP_GLOB))
    row.temp_left = f"{left_now} right after the kill, {left_after} after the next export"
    row.note = (
        f"killed {startup:.1f}-{full:.1f} s after the start: {kills - finished} while running "
        f"({kept_old} before and {kills - finished - kept_old} after the rename), "
        f"{finished} after the command had finished"
    )
    return row


def table(rows: list[Row]) -> str:
    lines = [
        "| fault | cases | detected | good `model.fsp` overwritten | temporary files left "
        "| notes |",
        "|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.fault} | {r.cases} | {r.detected}/{r.cases} ({100 * r.share:.1f} %) "
            f"| {r.overwritten if r.writes else '–'} | {r.temp_left} | {r.note} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="damaged files per fault kind")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs during export")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="also every bit flip and truncation of a 2.6 kB file and of a 2.9 kB file "
        "with N:M records (about 2 minutes)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        source = make_source(Path(tmp))
        size = source.stat().st_size
        rows = [
            bit_flips(source, args.cases, rng),
            bit_flips(source, args.cases, rng, headers_only=True),
            truncations(source, args.cases, rng),
        ]
        if args.kills:
            rows.append(sigkill_during_export(source, args.kills, rng))
        if args.exhaustive:
            rows += every_fault(make_small_source(Path(tmp)))
            nm = make_small_source(Path(tmp), "2:4")
            rows += every_fault(nm, "two Linear layers at 2:4 (N:M records, format version 2)")
    print(
        f"mnist1d_cnn at 90 % sparsity, a {size:,}-byte .fsp; seed {args.seed}; "
        f"{time.perf_counter() - start:.0f} s\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
