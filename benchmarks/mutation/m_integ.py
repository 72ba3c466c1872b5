"""Mutants of the framework integrations: the shared driver, the Hugging Face and
Lightning callbacks and the torch.ao-style facade (docs/mutation-audit.md,
"The framework integrations")."""

FILE = "src/feather_sparse/integrations/_common.py"
DOC_TESTS = [
    "tests/test_docs.py::test_integrations_page_trainer_snippet_runs",
    "tests/test_docs.py::test_integrations_page_lightning_snippet_runs",
    "tests/test_docs.py::test_integrations_page_manual_optimization_snippet_builds",
    "tests/test_docs.py::test_integrations_page_ao_snippet_runs",
]
TESTS = [
    "tests/test_integrations_common.py",
    "tests/test_nm_integrations.py",
    "tests/test_integrations_hf.py",
    "tests/test_integrations_lightning.py",
    "tests/test_hf_models.py",
    *DOC_TESTS,
]
HF = "src/feather_sparse/integrations/hf.py"
HF_TESTS = [
    "tests/test_integrations_hf.py",
    "tests/test_hf_models.py",
    "tests/test_nm_integrations.py",
    DOC_TESTS[0],
]
LIGHTNING = "src/feather_sparse/integrations/lightning.py"
LIGHTNING_TESTS = [
    "tests/test_integrations_lightning.py",
    "tests/test_nm_integrations.py",
    DOC_TESTS[1],
    DOC_TESTS[2],
]
AO = "src/feather_sparse/integrations/ao.py"
AO_TESTS = ["tests/test_integrations_ao.py", DOC_TESTS[3]]
TIMEOUT = 300
MUTATIONS = [
    # ------------------------------------------------------------ _common.py: settings
    dict(
        id="int01",
        desc="model= / total_steps= not refused as the trainer's (reported as unknown arguments)",
        old="        if key in _FROM_TRAINER:\n            raise",
        new="        if False:\n            raise",
    ),
    dict(
        id="int02",
        desc="finalize / log_layers: an int accepted for the bool",
        old="            if not isinstance(value, bool):",
        new="            if not isinstance(value, (bool, int)):",
    ),
    dict(
        id="int03",
        desc="trainable-backbone probe sets up the caller's backbone object (no copy)",
        old="copy.deepcopy(backbone) if isinstance(backbone, Backbone) else config.make_backbone()",
        new="backbone if isinstance(backbone, Backbone) else config.make_backbone()",
    ),
    # ------------------------------------------------------------ _common.py: attach
    dict(
        id="int04",
        desc="attach: a backbone found trainable on the real model is refused but left attached",
        old="            pruner.remove()\n            raise _trainable_backbone_error",
        new="            raise _trainable_backbone_error",
    ),
    dict(
        id="int05",
        desc="attach: the pending state is not consumed (applied again by a later attach)",
        old="pending, self._pending = self._pending, None",
        new="pending = self._pending",
    ),
    dict(
        id="int06",
        desc="attach: a refused saved state leaves the Pruner attached (no reset)",
        old="                self.reset()  # leave the model as it was\n",
        new="",
    ),
    dict(
        id="int07",
        desc="attach: the callback's own settings check of a saved state skipped",
        old="                _check_resumable(self.owner, pruner, pending)\n",
        new="",
    ),
    dict(
        id="int08",
        desc="settings message: the first differing layer index 0 when one list is a prefix",
        old="            min(len(theirs), len(ours)),",
        new="            0,",
    ),
    # ------------------------------------------------------------ _common.py: metrics, state
    dict(
        id="int09",
        desc="metrics: feather/sparsity is the scheduled sparsity, not what the forward zeroes",
        old='"feather/sparsity": report.sparsity,',
        new='"feather/sparsity": report.scheduled_sparsity,',
    ),
    dict(
        id="int10",
        desc="metrics: one feather/threshold (the first layer's) even when the layers' differ",
        old="        if min(values) == max(values):",
        new="        if min(values) <= max(values):",
    ),
    dict(
        id="int11",
        desc="metrics (log_layers): a layer's sparsity logged as its threshold",
        old='out[f"feather/sparsity/{row.name}"] = row.sparsity',
        new='out[f"feather/sparsity/{row.name}"] = row.threshold',
    ),
    dict(
        id="int12",
        desc="state_dict while detached: the pending (restored, not yet applied) state dropped",
        old="        return dict(self._pending or {})",
        new="        return {}",
    ),
    dict(
        id="int13",
        desc="load_state_dict: an empty state kept as pending (applied at the next attach)",
        old="self._pending = dict(state) if state else None",
        new="self._pending = dict(state)",
    ),
    dict(
        id="int14",
        desc="check_step: a Pruner behind the trainer's step accepted (at > step)",
        old="        if at != step:",
        new="        if at > step:",
    ),
    dict(
        id="int15",
        desc="check_step: the Pruner left attached when the steps differ",
        old="            self.reset()  # leave the model plain, as a failed attach does\n",
        new="",
    ),
    dict(
        id="int16",
        desc="finish: finalize flag inverted (bakes with finalize=False, detaches with True)",
        old="        if self.finalize:",
        new="        if not self.finalize:",
    ),
    # ------------------------------------------------------------ hf.py
    dict(
        id="int17",
        desc="on_train_begin: a fresh run (global_step 0) taken for a resume",
        old="        if state.global_step > 0:",
        new="        if state.global_step >= 0:",
        file=HF,
        tests=HF_TESTS,
    ),
    dict(
        id="int18",
        desc="total_steps in micro-batches (max_steps × gradient_accumulation_steps)",
        old="self._driver.attach(model, int(state.max_steps))",
        new="self._driver.attach(model, int(state.max_steps) * args.gradient_accumulation_steps)",
        file=HF,
        tests=HF_TESTS,
    ),
    dict(
        id="int19",
        desc="the Pruner also steps at every micro-batch (on_substep_end)",
        old="    def on_log(\n",
        new=(
            "    def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:\n"
            "        self._driver.step()\n\n"
            "    def on_log(\n"
        ),
        file=HF,
        tests=HF_TESTS,
    ),
    dict(
        id="int20",
        desc="on_log: the metrics not added to state.log_history",
        old="            state.log_history[-1].update(metrics)",
        new="            pass",
        file=HF,
        tests=HF_TESTS,
    ),
    dict(
        id="int21",
        desc="on_save: args.should_save ignored (every process writes the Pruner state)",
        old="        if not args.should_save or not self._driver.attached:",
        new="        if not self._driver.attached:",
        file=HF,
        tests=HF_TESTS,
    ),
    dict(
        id="int22",
        desc="_load: a file holding something other than a dict accepted as the state",
        old="        if not isinstance(loaded, dict):",
        new="        if loaded is None:",
        file=HF,
        tests=HF_TESTS,
    ),
    dict(
        id="int23",
        desc="install: the callback appended after the loggers instead of put first",
        old="trainer.callback_handler.callbacks.insert(0, self)",
        new="trainer.callback_handler.callbacks.append(self)",
        file=HF,
        tests=HF_TESTS,
    ),
    # ------------------------------------------------------------ lightning.py
    dict(
        id="int24",
        desc="total_steps=True accepted (a bool taken for 1)",
        old="isinstance(total_steps, bool) or not isinstance(total_steps, int)",
        new="not isinstance(total_steps, int)",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int25",
        desc="_total: an infinite estimate not refused (int(inf) overflows)",
        old="if not math.isfinite(estimated)",
        new="if math.isnan(estimated)",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int26",
        desc="batches of the fit: max_epochs=-1 (unbounded) counted as one epoch",
        old="trainer.max_epochs is None or trainer.max_epochs == -1 or",
        new="trainer.max_epochs is None or",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int27",
        desc="on_train_start: the trainer step seen so far reset to 0 (not the resumed step)",
        old="        self._seen_global_step = trainer.global_step\n        self._warn_weights_only",
        new="        self._seen_global_step = 0\n        self._warn_weights_only",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int28",
        desc="on_train_batch_end: a batch without an optimizer step also steps the Pruner",
        old="        if moved == 0:\n            return",
        new="        if moved < 0:\n            return",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int29",
        desc="logging cadence by trainer.global_step instead of the Pruner's step",
        old="if every > 0 and pruner.current_step % every == 0:",
        new="if every > 0 and trainer.global_step % every == 0:",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int30",
        desc="log_every_n_steps=0 (logging off) not handled (modulo by zero)",
        old="if every > 0 and pruner.current_step % every == 0:",
        new="if pruner.current_step % every == 0:",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int31",
        desc="manual optimization: batches checked in the first epoch only",
        old="        if self._manual and self.total_steps is None:",
        new="        if self._manual and self.total_steps is None and trainer.current_epoch == 0:",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int32",
        desc="manual max_steps check: a fit that runs exactly its batches refused (>=)",
        old="self._batches * moved > trainer.max_steps",
        new="self._batches * moved >= trainer.max_steps",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int33",
        desc="on_train_end: warns of a jump also when the schedule reached its target (<=)",
        old="            if scheduled < pruner.sparsity:",
        new="            if scheduled <= pruner.sparsity:",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int34",
        desc="the fit's own validation (sanity check) bakes a restored state as a checkpoint's",
        old="        if trainer.state.fn == TrainerFn.FITTING:\n            return",
        new="        if False:\n            return",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    dict(
        id="int35",
        desc="on_fit_end: a finished fit's state applied but not finalized",
        old="            self.on_train_start(trainer, pl_module)\n            self._driver.finish()",
        new="            self.on_train_start(trainer, pl_module)",
        file=LIGHTNING,
        tests=LIGHTNING_TESTS,
    ),
    # ------------------------------------------------------------ ao.py
    dict(
        id="int36",
        desc="FeatherSparsifier(include=...) accepted (then overridden by prepare's config)",
        old='        if "include" in pruner_kwargs:',
        new="        if False:",
        file=AO,
        tests=AO_TESTS,
    ),
    dict(
        id="int37",
        desc="prepare(config=[]) prunes every Conv/Linear (an empty list taken for None)",
        old="        if config is not None:",
        new="        if config:",
        file=AO,
        tests=AO_TESTS,
    ),
    dict(
        id="int38",
        desc="prepare: config keys other than tensor_fqn (sparsity_level) accepted",
        old="        if other:",
        new="        if False:",
        file=AO,
        tests=AO_TESTS,
    ),
]
