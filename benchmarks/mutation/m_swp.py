"""Mutants of ``Pruner.swapped()``: src/feather_sparse/swap.py (which steps swap, the
swap in and out, the refusals), the parametrization's pass-through in pruner.py,
and the training loop's use of the block (docs/mutation-audit.md, "swapped()").

A mutant with a ``file`` key mutates that file instead of FILE.
"""

FILE = "src/feather_sparse/swap.py"
PRUNER = "src/feather_sparse/pruner.py"
LOOP = "src/feather_sparse/train/loop.py"
TIMEOUT = 300
TESTS = ["tests/test_swap.py"]

MUTATIONS = [
    # --- which steps swap: only where the backward is the identity
    dict(
        id="sw01",
        desc="θ < 1 swaps too (its pruned weights' gradients would not be scaled)",
        old="    if any(p.theta != 1.0 for p in layers):",
        new="    if False:",
    ),
    dict(
        id="sw02",
        desc="SR-STE's decay swaps too (its gradient term would be lost)",
        old="        if backbone.decay != 0.0:",
        new="        if False:",
    ),
    dict(
        id="sw03",
        desc="an operator other than P_T (ST-3) swaps too",
        old="    if not isinstance(pruner.operator, ThresholdOperator):",
        new="    if False:",
    ),
    dict(
        id="sw04",
        desc="a backbone with a forward of its own (ASL+, Spartan) swaps too",
        old="        if not isinstance(backbone, NMBackbone):",
        new="        if False:",
    ),
    dict(
        id="sw05",
        desc="a non-contiguous weight swaps too",
        old="        if not weight.is_contiguous():",
        new="        if False:",
    ),
    # --- the swap in and out
    dict(
        id="sw06",
        desc="P_T(w) not put into the stored weights (the layers meet w)",
        old="        for w, value in zip(stored, written):\n            w.data = value",
        new="        for w, value in zip(stored, written):\n            pass",
    ),
    dict(
        id="sw07",
        desc="the parametrizations not told to pass the stored weight through",
        old='            vars(p)["passthrough"] = True',
        new='            vars(p)["passthrough"] = False',
    ),
    dict(
        id="sw08",
        desc="the dense weights not given back when the block ends",
        old="            w.data = value\n        else:",
        new="            pass\n        else:",
    ),
    dict(
        id="sw09",
        desc="an error inside the block leaves P_T(w) in the weights",
        old="    finally:  # an error inside the block ends it too\n",
        new="    except BaseException:\n        pruner._swap = None\n        raise\n    else:\n",
    ),
    # --- the refusals
    dict(
        id="sw10",
        desc="an optimizer step inside the block is not refused (its update silently undone)",
        old="    if changed:\n        raise RuntimeError(",
        new="    if False:\n        raise RuntimeError(",
    ),
    dict(
        id="sw11",
        desc="the versions read off by one (every block refused as written)",
        old="    versions = [w._version for w in stored]",
        new="    versions = [w._version - 1 for w in stored]",
    ),
    dict(
        id="sw12",
        desc="the Pruner not marked inside the block (its step() reads P_T(w) as dense)",
        old="        pruner._swap = True\n",
        new="",
    ),
    dict(
        id="sw13",
        desc="a nested block not refused",
        old='    if pruner._swap is not None:\n        raise RuntimeError(\n            "pruner.swapped() entered',
        new='    if False:\n        raise RuntimeError(\n            "pruner.swapped() entered',
    ),
    # --- pruner.py: the pass-through and the refusals there
    dict(
        id="sw14",
        desc="the parametrization ignores the pass-through (P_T applied to P_T(w))",
        old="        if self.passthrough:  # inside Pruner.swapped(): the stored weight is P_T(w)\n            return weight\n",
        new="",
        file=PRUNER,
    ),
    dict(
        id="sw15",
        desc="report() not refused inside the block",
        old='        self._refuse_while_swapped("report()")\n',
        new="",
        file=PRUNER,
    ),
    dict(
        id="sw16",
        desc="a copy of an attached Pruner made inside the block believes itself inside it",
        old="        self._swap = None  # a copy is not inside its original's swapped() block\n",
        new="",
        file=PRUNER,
    ),
    dict(
        id="sw20",
        desc="a copy of the model made inside the block keeps passing its stored weight through",
        old='        state.pop("passthrough", None)\n',
        new="",
        file=PRUNER,
    ),
    dict(
        id="sw21",
        desc="a write inside the block keeps the N:M cache whose memory it reached",
        old="        if changed:  # into memory a cached forward may hand out again: recompute those\n"
        "            pruner.backbone.release()\n",
        new="",
    ),
    dict(
        id="sw22",
        desc="a weight converted inside the block (model.double()) takes its old memory back",
        old="        if n is w and w.dtype == value.dtype and w.device == value.device:",
        new="        if n is w:",
    ),
    dict(
        id="sw23",
        desc="the layers keep reading their weight directly after the block",
        old="        _read_through(direct)\n",
        new="",
    ),
    dict(
        id="sw24",
        desc="the property removed from the class instead of stood in for (a copy sharing the "
        "class loses its weight)",
        old="            setattr(cls, _NAME, _Through(prop))",
        new="            delattr(cls, _NAME)",
    ),
    dict(
        id="sw25",
        desc="no layer reads its weight directly (every read through the property)",
        old="        module.__dict__[_NAME] = t.weight\n",
        new="",
    ),
    # --- the line above which a layer keeps its usual forward
    dict(
        id="sw18",
        desc="every layer swapped, however large",
        old="        if not 0 < t.numel <= SWAP_MAX_NUMEL:",
        new="        if not 0 < t.numel:",
    ),
    dict(
        id="sw19",
        desc="a block with no layer under the line says it swapped",
        old='    if not swaps:\n        return f"no layer has at most',
        new='    if False:\n        return f"no layer has at most',
    ),
    # --- the training loop
    dict(
        id="sw17",
        desc="the training loop runs the usual step (no swapped() block)",
        old="with contextlib.nullcontext() if pruner is None else pruner.swapped():",
        new="with contextlib.nullcontext():",
        file=LOOP,
    ),
]
