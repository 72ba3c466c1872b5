"""Mutants of the benchmark statistics: src/feather_sparse/bench/stats.py (the
Student-t quantile, the paired difference over seeds, its interval and verdict),
src/feather_sparse/bench/claims.py (the paper's claims: cells, pairs, the
claim's verdict, the claims page) and the parts of src/feather_sparse/bench/pages.py
(and the helpers they call) that turn those numbers into the results pages'
tables: the paired table, the mean ± std table and its best mean, the N:M
page's ranking.

A mutant with a ``file`` key mutates that file instead of FILE. Every mutant runs
TESTS (all single-process), the most specific first: the run stops at the first
failure (-x).
"""

FILE = "src/feather_sparse/bench/stats.py"
CLAIMS = "src/feather_sparse/bench/claims.py"
PAGES = "src/feather_sparse/bench/pages.py"
SUMMARY = "src/feather_sparse/analysis/summary.py"
NM_PAGE = "src/feather_sparse/bench/experiments/nm.py"
TIMEOUT = 420  # per mutant: the whole list takes about 50 s on a shared 2-core machine

TESTS = [
    "tests/test_bench_stats.py",
    "tests/test_bench_claims.py",
    "tests/test_experiments.py",
    "tests/test_bench_sweeps.py",
    "tests/test_nm_bench.py",
    "tests/test_bench_wording.py",
    "tests/test_bench_audit.py",
    "tests/test_bench_options.py",
    "tests/test_cli.py",
]

MUTATIONS = [
    # --- the interval d̄ ± t(0.975, n − 1) · s_d / √n
    dict(
        id="st01",
        desc="t quantile at 0.95 (one-sided) instead of 0.975",
        old="student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1)",
        new="student_t_quantile(CONFIDENCE, n - 1)",
    ),
    dict(
        id="st02",
        desc="t with n degrees of freedom instead of n − 1",
        old="student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1)",
        new="student_t_quantile(0.5 + CONFIDENCE / 2.0, n)",
    ),
    dict(
        id="st03",
        desc="normal quantile 1.96 instead of Student's t",
        old="half = student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1) * sd",
        new="half = 1.959963984540054 * sd",
    ),
    dict(
        id="st04",
        desc="standard error s_d / √(n − 1) instead of s_d / √n",
        old="* sd / math.sqrt(n)",
        new="* sd / math.sqrt(n - 1)",
    ),
    dict(
        id="st05",
        desc="population standard deviation (ddof = 0: / n instead of / (n − 1))",
        old="sum((d - mean) ** 2 for d in diffs) / (n - 1))",
        new="sum((d - mean) ** 2 for d in diffs) / n)",
    ),
    dict(
        id="st06",
        desc="sign turned over: reference − values instead of values − reference",
        old="values[s] - reference[s]\n",
        new="reference[s] - values[s]\n",
    ),
    dict(
        id="st07",
        desc="unpaired: the i-th finished run of each row paired, whatever their seeds",
        old=(
            "    diffs: Sequence[float] = [\n"
            "        values[s] - reference[s]\n"
            "        for s in sorted(values)\n"
            "        if s in reference and math.isfinite(values[s]) and math.isfinite(reference[s])\n"
            "    ]"
        ),
        new=(
            "    diffs: Sequence[float] = [\n"
            "        a - b\n"
            "        for a, b in zip(\n"
            "            [values[s] for s in sorted(values) if math.isfinite(values[s])],\n"
            "            [reference[s] for s in sorted(reference) if math.isfinite(reference[s])],\n"
            "        )\n"
            "    ]"
        ),
    ),
    dict(
        id="st08",
        desc="a NaN (unfinished) reference run kept in the pairs (only the row's value checked)",
        old="if s in reference and math.isfinite(values[s]) and math.isfinite(reference[s])",
        new="if s in reference and math.isfinite(values[s])",
    ),
    dict(
        id="st09",
        desc="two pairs get no interval either (n < 3 instead of n < 2)",
        old="    if n < 2:\n        return PairedDifference(n, mean, math.nan, math.nan)",
        new="    if n < 3:\n        return PairedDifference(n, mean, math.nan, math.nan)",
    ),
    dict(
        id="st10",
        desc="mean over n − 1 instead of n",
        old="mean = sum(diffs) / n",
        new="mean = sum(diffs) / max(n - 1, 1)",
    ),
    dict(
        id="st11",
        desc="confidence level 0.9 instead of 0.95",
        old="CONFIDENCE = 0.95",
        new="CONFIDENCE = 0.9",
    ),
    # --- the verdict: win / loss only when the interval excludes 0
    dict(
        id="st12",
        desc="win when the interval's low end touches 0 (low >= 0)",
        old="if self.low > 0:",
        new="if self.low >= 0:",
    ),
    dict(
        id="st13",
        desc="loss when the interval's high end touches 0 (high <= 0)",
        old="if self.high < 0:",
        new="if self.high <= 0:",
    ),
    dict(
        id="st14",
        desc="loss when the mean is below 0 (the interval ignored on that side)",
        old="if self.high < 0:",
        new="if self.mean < 0:",
    ),
    dict(
        id="st15",
        desc="verdict from the interval rounded to two decimals (as the tables show it)",
        old="if self.low > 0:",
        new="if round(self.low, 2) > 0:",
    ),
    # --- the Student-t CDF and its inverse
    dict(
        id="st16",
        desc="CDF tails swapped (P(T <= t) = tail for t >= 0)",
        old="return 1.0 - tail if t >= 0 else tail",
        new="return tail if t >= 0 else 1.0 - tail",
    ),
    dict(
        id="st17",
        desc="beta argument x = ν / (ν + t) instead of ν / (ν + t²)",
        old="df / (df + t * t)",
        new="df / (df + abs(t))",
    ),
    dict(
        id="st18",
        desc="lower quantiles not mirrored (q < 0.5 returns +t(1 − q))",
        old="return -student_t_quantile(1.0 - q, df)",
        new="return student_t_quantile(1.0 - q, df)",
    ),
    dict(
        id="st19",
        desc="continued fraction cut after two rounds (range(1, 3) instead of 1000)",
        old="for m in range(1, 1000):",
        new="for m in range(1, 3):",
    ),
    dict(
        id="st20",
        desc="the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) never used (slow side of the fraction)",
        old="if x < (a + 1.0) / (a + b + 2.0):",
        new="if True:",
    ),
    # --- the claims: cells, pairs, verdict, page
    dict(
        id="st21",
        desc="claim reproduced only with more than half the cells wins (> instead of >=)",
        file=CLAIMS,
        old='if verdicts.count("win") * 2 >= len(verdicts):',
        new='if verdicts.count("win") * 2 > len(verdicts):',
    ),
    dict(
        id="st22",
        desc="claim reproduced with any win (not at least half the cells)",
        file=CLAIMS,
        old='if verdicts.count("win") * 2 >= len(verdicts):',
        new='if verdicts.count("win") >= 1:',
    ),
    dict(
        id="st23",
        desc="cells without an interval ('—') counted in the claim's verdict",
        file=CLAIMS,
        old='verdicts = [c.diff.verdict for c in comparisons if c.diff.verdict != "—"]',
        new="verdicts = [c.diff.verdict for c in comparisons]",
    ),
    dict(
        id="st24",
        desc="a loss ignored when the claim also has a win",
        file=CLAIMS,
        old='if "loss" in verdicts:',
        new='if "loss" in verdicts and "win" not in verdicts:',
    ),
    dict(
        id="st25",
        desc="runs of a cell numbered in the page's order instead of by seed (pairs mismatched)",
        file=CLAIMS,
        old='cells.setdefault((row["group"], float(row["x"])), {})[int(row["seed"])] = 100 * float(acc)',
        new='(c := cells.setdefault((row["group"], float(row["x"])), {}))[len(c)] = 100 * float(acc)',
    ),
    dict(
        id="st26",
        desc="a claim's sparsity filter (keep) ignored: every cell compared",
        file=CLAIMS,
        old="xs = sorted({x for (_, x) in cells if keep(x)})",
        new="xs = sorted({x for (_, x) in cells})",
    ),
    dict(
        id="st27",
        desc="claim cell measured worse − better (arguments swapped)",
        file=CLAIMS,
        old="paired_difference(cells[(better, x)], cells[(worse, x)])",
        new="paired_difference(cells[(worse, x)], cells[(better, x)])",
    ),
    dict(
        id="st28",
        desc="'at high sparsity' from above 98 % (x > 0.98 instead of >=)",
        file=CLAIMS,
        old="lambda x: x >= 0.98,",
        new="lambda x: x > 0.98,",
    ),
    dict(
        id="st29",
        desc="stability: halfway by the count of measurements, not the last measured epoch",
        file=CLAIMS,
        old="target = fraction * o.stability_epochs[-1]",
        new="target = fraction * len(o.stability_epochs)",
    ),
    dict(
        id="st30",
        desc="p claim: p = 3 also compared with itself",
        file=CLAIMS,
        old="for g in sorted({g for g, _ in cells if g != _P3})",
        new="for g in sorted({g for g, _ in cells})",
    ),
    dict(
        id="st31",
        desc="claims page tally: wins and losses swapped (loss / n.s. / win)",
        file=CLAIMS,
        old="f\"{counts.count('win')} / {counts.count('n.s.')} / {counts.count('loss')}\"",
        new="f\"{counts.count('loss')} / {counts.count('n.s.')} / {counts.count('win')}\"",
    ),
    dict(
        id="st32",
        desc="claims page: only 'reproduced' in bold (a result against the paper shown plainer)",
        file=CLAIMS,
        old='lines.append(f"| {r.claim} | {r.source} | {r.evidence} | {tally} | **{r.verdict}** |")',
        new=(
            "verdict = f\"**{r.verdict}**\" if r.verdict == 'reproduced' else r.verdict\n"
            '        lines.append(f"| {r.claim} | {r.source} | {r.evidence} | {tally} | {verdict} |")'
        ),
    ),
    # --- the results pages' tables
    dict(
        id="st33",
        desc="paired table: reference − row instead of row − reference",
        file=PAGES,
        old="paired_difference(self.by_seed.get((r, c), {}), self.by_seed.get((ref, c), {}))",
        new="paired_difference(self.by_seed.get((ref, c), {}), self.by_seed.get((r, c), {}))",
    ),
    dict(
        id="st34",
        desc="paired table: only a win in bold (a loss shown like n.s.)",
        file=PAGES,
        old='verdict = d.verdict if d.verdict == "n.s." else f"**{d.verdict}**"',
        new='verdict = d.verdict if d.verdict != "win" else f"**{d.verdict}**"',
    ),
    dict(
        id="st35",
        desc="paired table: no common seed shown as an interval (the n = 0 case dropped)",
        file=PAGES,
        old='if d.n == 0:\n                    cells.append("—")',
        new='if d.n < 0:\n                    cells.append("—")',
    ),
    dict(
        id="st36",
        desc="Grid pairs runs by their order in the cell, not by seed",
        file=PAGES,
        old="self.by_seed.setdefault(cell, {})[spec.seed] = value",
        new="self.by_seed.setdefault(cell, {})[len(self.values[cell]) - 1] = value",
    ),
    dict(
        id="st37",
        desc="table: best='max' marks the least mean (max and min swapped)",
        file=PAGES,
        old='bests[c] = max(finite) if best == "max" else min(finite)',
        new='bests[c] = min(finite) if best == "max" else max(finite)',
    ),
    dict(
        id="st38",
        desc="mean ± std with the population standard deviation (ddof = 0)",
        file=SUMMARY,
        old="return statistics.fmean(vals), statistics.stdev(vals)",
        new="return statistics.fmean(vals), statistics.pstdev(vals)",
    ),
    dict(
        id="st39",
        desc="N:M ranking in ascending order (the worst method first)",
        file=NM_PAGE,
        old="order = sorted(means, key=lambda m: -mean_std(means[m])[0])",
        new="order = sorted(means, key=lambda m: mean_std(means[m])[0])",
    ),
]
