"""Where the paper's claims stand on the stored results of a results folder (``bench claims``).

Each claim of Glentis Georgoulakis et al. (BMVC 2023) is read as "row A is
above row B" on one experiment's page, cell by cell (same sparsity), and
measured as the paired difference over seeds with its 95 % Student-t
interval (:mod:`feather_sparse.bench.stats`). A claim's verdict follows one
rule, written on the page:

- *not reproduced*: some cell is a loss (the interval lies below 0);
- *reproduced*: no loss, and at least half the cells are wins;
- *not separable*: otherwise (the intervals mostly contain 0);
- *not measured*: the folder has no page (or no two paired seeds) for it.

Only stored results are read (the pages' ``<experiment>.json``, and for mask
stability the runs' ``result.json``); nothing is trained.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feather_sparse.bench.runner import RunOutcome, load_outcome
from feather_sparse.bench.stats import CONFIDENCE, PairedDifference, paired_difference
from feather_sparse.integrity import write_atomic

__all__ = ["ClaimResult", "Comparison", "assess_claims", "claims_page", "write_claims"]

# (group, x) -> seed -> value
Cells = dict[tuple[str, float], dict[int, float]]
# (better row, worse row) pairs of a claim, or a function of the cells giving them
Pairs = Sequence[tuple[str, str]] | Callable[[Cells], Sequence[tuple[str, str]]]


@dataclass(frozen=True)
class Comparison:
    """One cell of a claim: ``better`` minus ``worse`` at one sparsity, paired over seeds.

    Attributes:
        better: the method the claim says is better.
        worse: the method it is compared with.
        x: the sparsity of the cell.
        diff: the paired difference ``better − worse`` over seeds.
    """

    better: str
    worse: str
    x: float
    diff: PairedDifference


@dataclass(frozen=True)
class ClaimResult:
    """A claim of the paper and what the stored runs say about it.

    Attributes:
        claim: the claim, in a few words.
        source: where the paper makes it.
        evidence: which page and rows measure it, and in what unit.
        comparisons: the cells.
        verdict: reproduced / not reproduced / not separable / not measured.
        note: why it was not measured, if so.
    """

    claim: str
    source: str
    evidence: str
    comparisons: tuple[Comparison, ...]
    verdict: str
    note: str = ""


def _verdict(comparisons: Sequence[Comparison]) -> str:
    verdicts = [c.diff.verdict for c in comparisons if c.diff.verdict != "—"]
    if not verdicts:
        return "not measured"
    if "loss" in verdicts:
        return "not reproduced"
    if verdicts.count("win") * 2 >= len(verdicts):
        return "reproduced"
    return "not separable"


def _page_rows(file: Path, name: str, fields: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of a page's ``OUT/<name>.json``, each with ``fields``.

    Raises:
        ValueError: naming ``file``, for a file that is not such rows (cut
            short, or edited by hand), and saying how to write it again.
    """
    try:
        rows = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON (a write cut short), or not text
        raise _damaged(file, name, f"it is not readable JSON ({err})") from None
    if not isinstance(rows, list):
        raise _damaged(file, name, "it holds no list of runs")
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise _damaged(file, name, f"its run {i} is not a JSON object")
        missing = [k for k in fields if k not in row]
        if missing:
            raise _damaged(file, name, f"its run {i} has no {', '.join(map(repr, missing))}")
    return rows


def _damaged(file: Path, name: str, what: str) -> ValueError:
    """The error for a page's ``file`` that cannot be read: what is wrong, and the fix."""
    page = file.with_suffix(".md")
    try:
        found = re.search(r"^- command: `(.+)`$", page.read_text(encoding="utf-8"), re.MULTILINE)
    except (OSError, ValueError):  # no page beside it, or not text
        found = None
    command = (
        f"`{found.group(1)}` (the command on {page.name})"
        if found
        else f"`feather-sparse bench {name}` with the flags that made it"
    )
    return ValueError(
        f"{file} is damaged: {what}; run {command} again to write it again from the stored runs"
    )


def _accuracy_cells(out: Path, name: str) -> Cells | None:
    """Top-1 accuracy (%) per (row, sparsity) and seed from ``OUT/<name>.json``; None if absent.

    Raises:
        ValueError: for a damaged file (see :func:`_page_rows`).
    """
    file = out / f"{name}.json"
    if not file.is_file():
        return None
    cells: Cells = {}
    for i, row in enumerate(_page_rows(file, name, ("group", "x", "seed")), 1):
        try:
            _add_accuracy(cells, row)
        except (TypeError, ValueError) as err:
            what = f"its run {i} has a value that is not a number ({err})"
            raise _damaged(file, name, what) from None
    return cells


def _add_accuracy(cells: Cells, row: dict[str, Any]) -> None:
    """Add a page row's top-1 accuracy (%) to ``cells`` (not for a failed run or no metric)."""
    acc = row.get("test_accuracy")
    if not row.get("ok") or acc is None or not math.isfinite(float(acc)):
        return
    cells.setdefault((row["group"], float(row["x"])), {})[int(row["seed"])] = 100 * float(acc)


def _compare_rows(
    cells: Cells, pairs: Sequence[tuple[str, str]], keep: Callable[[float], bool]
) -> tuple[Comparison, ...]:
    xs = sorted({x for (_, x) in cells if keep(x)})
    out = []
    for better, worse in pairs:
        for x in xs:
            if (better, x) in cells and (worse, x) in cells:
                d = paired_difference(cells[(better, x)], cells[(worse, x)])
                out.append(Comparison(better, worse, x, d))
    return tuple(out)


def _stability_cells(out: Path, runs_dir: Path, fraction: float = 0.5) -> Cells | None:
    """Pearson r with the final mask at ``fraction`` of training, per (θ row, sparsity) and seed."""
    file = out / "stability.json"
    if not file.is_file():
        return None
    cells: Cells = {}
    for i, row in enumerate(_page_rows(file, "stability", ("group", "x", "seed", "key")), 1):
        try:
            outcome = load_outcome(runs_dir / str(row["key"])) if row.get("ok") else None
            if outcome is None or not outcome.stability_epochs:
                continue
            r = _r_at(outcome, fraction)
            if math.isfinite(r):
                cells.setdefault((row["group"], float(row["x"])), {})[int(row["seed"])] = r
        except (TypeError, ValueError) as err:
            what = f"its run {i} has a value that is not a number ({err})"
            raise _damaged(file, "stability", what) from None
    return cells or None


def _r_at(o: RunOutcome, fraction: float) -> float:
    target = fraction * o.stability_epochs[-1]
    i = min(range(len(o.stability_epochs)), key=lambda j: abs(o.stability_epochs[j] - target))
    return o.stability_pearson[i]


@dataclass(frozen=True)
class _Claim:
    """A claim of the paper as pairs of rows on one page: ``better`` above ``worse``."""

    text: str  # "{better} above {worse}" filled in per pair
    source: str
    page: str
    pairs: Pairs
    keep: Callable[[float], bool] = lambda x: True
    where: str = ""  # which cells, in words
    unmeasured: tuple[str, str] = ("", "")  # the pair named when rows come from absent data


_P3 = "p = 3 (Feather)"

#: The paper's claims (Glentis Georgoulakis et al., BMVC 2023), in its order.
CLAIMS: tuple[_Claim, ...] = (
    _Claim(
        "Feather's operator above {worse} thresholding (θ = 1)",
        "§4.1, Fig. 2: steadily above, especially from 95 %",
        "operator",
        (("Feather (p = 3)", "hard"), ("Feather (p = 3)", "soft")),
        lambda x: x >= 0.95,
        "sparsity ≥ 95 %",
    ),
    _Claim(
        "Feather-Global above {worse} at high sparsity",
        "§4.2, Table 1",
        "compare",
        tuple(("Feather-Global", m) for m in ("ST-3", "Spartan", "GMP")),
        lambda x: x >= 0.98,
        "sparsity ≥ 98 %",
    ),
    _Claim(
        "θ < 1 helps from 95 % ({better} above {worse})",
        "§3.3 (automatic θ), §4.1, Fig. 3",
        "theta",
        (("θ = 0.5", "θ = 1"),),
        lambda x: x >= 0.95,
        "sparsity ≥ 95 %",
    ),
    _Claim(
        "p = 3 best: above {worse}",
        "appendix: p = 3 above p = 2, p = 4 no better; Fig. 2 for p = 1, ∞",
        "p",
        lambda cells: [(_P3, g) for g in sorted({g for g, _ in cells if g != _P3})],
        where="every sparsity",
        unmeasured=(_P3, "every other p"),
    ),
    _Claim(
        "Feather improves the {worse} backbone ({better} above {worse})",
        "§4.2 (ASL+, Table 1), appendix (GMP)",
        "backbones",
        (("Feather-GMP", "GMP"), ("Feather-ASL+", "ASL+")),
        where="every sparsity",
    ),
    _Claim(
        "the mask is more stable as θ falls ({better} above {worse})",
        "appendix, mask-stability figure",
        "stability",
        (("θ = 0", "θ = 1"),),
        where="Pearson r with the final mask at 50 % of training",
    ),
)


def assess_claims(out: Path, runs_dir: Path | None = None) -> list[ClaimResult]:
    """Each claim of the paper, one result per pair of rows, against the stored results in ``out``.

    Args:
        out: a results folder written by ``feather-sparse bench``.
        runs_dir: its runs folder (for mask stability); default ``out/runs``.
    """
    runs = runs_dir if runs_dir is not None else out / "runs"
    results = []
    for claim in CLAIMS:
        present = (out / f"{claim.page}.json").is_file()
        if claim.page == "stability":
            cells = _stability_cells(out, runs)
            missing = f"the runs' results are not in {runs} (give --runs-dir)"
        else:
            cells = _accuracy_cells(out, claim.page)
            missing = ""
        if not present:
            missing = f"no `{claim.page}` page here"
        if not callable(claim.pairs):
            pairs = claim.pairs
        elif cells:
            pairs = claim.pairs(cells)
        else:  # rows read from a page that is not there: one "not measured" line
            pairs = [claim.unmeasured]
        unit = "" if claim.page == "stability" else ", top-1 points"
        for better, worse in pairs:
            text = claim.text.format(better=better, worse=worse)
            evidence = f"`{claim.page}`: {better} − {worse}{unit}, {claim.where}"
            if cells is None:
                results.append(
                    ClaimResult(text, claim.source, evidence, (), "not measured", missing)
                )
                continue
            comparisons = _compare_rows(cells, [(better, worse)], claim.keep)
            note = "" if comparisons else f"the `{claim.page}` page lacks these rows or cells"
            results.append(
                ClaimResult(text, claim.source, evidence, comparisons, _verdict(comparisons), note)
            )
    return results


def _cell_text(c: Comparison, unit: str) -> str:
    d = c.diff
    where = f" at {100 * c.x:g} %" if c.x else ""
    if d.n == 0:  # both rows ran here, but no seed finished in both: nothing to pair
        return f"{c.better} − {c.worse}{where}: — (no seed finished in both)"
    if d.n < 2:
        return f"{c.better} − {c.worse}{where}: {d.mean:+.2f}{unit} (n = {d.n}, no interval)"
    return (
        f"{c.better} − {c.worse}{where}: {d.mean:+.2f}{unit} "
        f"[{d.low:+.2f}, {d.high:+.2f}], n = {d.n}: {d.verdict}"
    )


def claims_page(results: Sequence[ClaimResult], out: Path, command: str) -> str:
    """The Markdown page of :func:`assess_claims`.

    Args:
        results: the assessed claims.
        out: the results folder (named on the page).
        command: the command that rebuilds the page (shown on it).
    """
    level = f"{100 * CONFIDENCE:g} %"
    lines = [
        "# Where the paper's claims stand",
        "",
        f"Each claim of the paper against the stored runs in `{out}`: the paired difference "
        f"over seeds (same seed, same sparsity) with its {level} Student-t interval, per "
        "cell. A cell is a **win** when the interval lies above 0 (the claim holds there), a "
        "**loss** when below, n.s. otherwise. Verdict: *not reproduced* if any cell is a "
        "loss; *reproduced* if none is and at least half are wins; *not separable* "
        "otherwise; *not measured* without the page or two paired seeds.",
        "",
        "| claim | paper | measured by | cells (win / n.s. / loss) | verdict |",
        "|---|---|---|---:|---|",
    ]
    for r in results:
        counts = [c.diff.verdict for c in r.comparisons]
        tally = (
            f"{counts.count('win')} / {counts.count('n.s.')} / {counts.count('loss')}"
            if r.comparisons
            else "—"
        )
        lines.append(f"| {r.claim} | {r.source} | {r.evidence} | {tally} | **{r.verdict}** |")
    lines += ["", "## The numbers", ""]
    for r in results:
        unit = "" if "Pearson" in r.evidence else " points"
        lines.append(f"**{r.claim}** — {r.verdict}" + (f" ({r.note})" if r.note else ""))
        lines.append("")
        if r.comparisons:
            lines += [f"- {_cell_text(c, unit)}" for c in r.comparisons]
            lines.append("")
    lines.append(f"- command: `{command}`")
    return "\n".join(lines) + "\n"


def write_claims(out: Path, runs_dir: Path | None = None, command: str | None = None) -> Path:
    """Assess the claims on ``out`` and write ``out/claims.md``; returns the page.

    Args:
        out: the results folder of ``feather-sparse bench``.
        runs_dir: the runs folder, if not the default under ``out``.
        command: the command shown on the page; default the ``bench claims`` one.

    Raises:
        FileNotFoundError: if ``out`` is not a folder.
    """
    if not out.is_dir():
        raise FileNotFoundError(
            f"{out} is not a results folder: run `feather-sparse bench ... --out {out}` first"
        )
    results = assess_claims(out, runs_dir)
    if command is None:
        command = f"feather-sparse bench claims --out {out}"
        if runs_dir is not None:
            command += f" --runs-dir {runs_dir}"
    page = out / "claims.md"
    write_atomic(page, claims_page(results, out, command).encode())
    return page
