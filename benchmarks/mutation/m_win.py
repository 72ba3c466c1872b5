"""Mutants of the GPU selection path: one buffer of the magnitudes, and the window
a sorted sample places around rank k (selection._sort_select, _kth_in_window)."""

FILE = "src/feather_sparse/selection.py"
TESTS = [
    "tests/test_selection_sort.py",
    "tests/test_selection.py",
]
MUTATIONS = [
    dict(
        id="win01",
        desc="below the window: |w| <= lo instead of < lo",
        old="below = mags < sample[i_lo]",
        new="below = mags <= sample[i_lo]",
    ),
    dict(
        id="win02",
        desc="the window holds the rank when a <= k (exactly k below it)",
        old="if not (a < k <= b and m * WINDOW_MAX_SHARE <= n):",
        new="if not (a <= k <= b and m * WINDOW_MAX_SHARE <= n):",
    ),
    dict(
        id="win03",
        desc="rank inside the window off by one (k - a)",
        old="return torch.sort(inside).values[k - a - 1]",
        new="return torch.sort(inside).values[min(k - a, inside.numel() - 1)]",
    ),
    dict(
        id="win04",
        desc="the window keeps everything up to hi (the magnitudes below lo too)",
        old="inside = mags[at_most_hi.logical_xor_(below)]",
        new="inside = mags[at_most_hi]",
    ),
    dict(
        id="win05",
        desc="the window sorted in descending order",
        old="return torch.sort(inside).values[k - a - 1]",
        new="return torch.sort(inside, descending=True).values[k - a - 1]",
    ),
    dict(
        id="win06",
        desc="a window of exactly one in WINDOW_MAX_SHARE is refused (< n)",
        old="m * WINDOW_MAX_SHARE <= n",
        new="m * WINDOW_MAX_SHARE < n",
    ),
    dict(
        id="win07",
        desc="no margin: the window is the sample's two neighbours of the rank",
        old="margin = 4.0 * math.sqrt(s * q * (1.0 - q)) + 16.0",
        new="margin = 0.0",
    ),
    dict(
        id="win08",
        desc="the sample is not sorted",
        old="sample = torch.sort(mags[:: n // WINDOW_SAMPLE]).values",
        new="sample = mags[:: n // WINDOW_SAMPLE]",
    ),
    dict(
        id="win09",
        desc="the two counts read back swapped",
        old="a, b = torch.stack([below.sum(), at_most_hi.sum()]).tolist()",
        new="b, a = torch.stack([below.sum(), at_most_hi.sum()]).tolist()",
    ),
    dict(
        id="win10",
        desc="a window reaching the sample's last element is used (i_hi > s)",
        old="if i_lo < 0 or i_hi >= s:",
        new="if i_lo < 0 or i_hi > s:",
    ),
    dict(
        id="win11",
        desc="a miss returns the whole sort's value without its NaN check",
        old="""    if value is not None:
        return value
    value = torch.sort(mags).values[k - 1]""",
        new="""    if value is not None or True:
        return value if value is not None else torch.sort(mags).values[k - 1]
    value = torch.sort(mags).values[k - 1]""",
    ),
    dict(
        id="win12",
        desc="the whole sort's rank off by one (k instead of k - 1), capped",
        old="    value = torch.sort(mags).values[k - 1]\n    if torch.isnan(value):",
        new="    value = torch.sort(mags).values[min(k, n - 1)]\n    if torch.isnan(value):",
    ),
    dict(
        id="win13",
        desc="the window tried at every size (no WINDOW_MIN)",
        old="    if n < WINDOW_MIN:\n        return None",
        new="    if n < 0:\n        return None",
    ),
    dict(
        id="win14",
        desc="the per-tensor maximum taken from the weight in its own dtype, not from the buffer",
        old="maxima.append(a.amax() if m else torch.zeros((), dtype=dtype, device=device))",
        new="maxima.append(t.detach().abs().amax() if m else torch.zeros((), dtype=dtype, device=device))",
    ),
]
