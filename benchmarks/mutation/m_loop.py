"""Mutants of the training loop and its recipes: the optimizer and the LR schedule
(train/optim.py), the loop itself (train/loop.py: the step, evaluation, the
epoch's bookkeeping, checkpoints), the session (train/session.py: seeding,
building, restoring a checkpoint) and the checkpoint helpers
(train/checkpoint.py: RNG states, resume checks).

Every mutant names the file it mutates (``file``) and runs the tests of that
file's set (``tests``), found with ``grep`` on the module's names, most
specific first; the run stops at the first failure (-x). ``TESTS`` is the
union (the baseline run).
"""

FILE = "src/feather_sparse/train/optim.py"
TIMEOUT = 420  # per mutant: a survivor runs its whole set (about 100 s here)
LOOP = "src/feather_sparse/train/loop.py"
SESSION = "src/feather_sparse/train/session.py"
CKPT = "src/feather_sparse/train/checkpoint.py"

OPTIM_TESTS = [
    "tests/test_train.py",
    "tests/test_baselines.py",
    "tests/test_train_cli_checks.py",
    "tests/test_nm_train.py",
]
LOOP_TESTS = [
    "tests/test_train.py",
    "tests/test_train_modes.py",
    "tests/test_amp.py",
    "tests/test_faults.py",
    "tests/test_train_process_state.py",
    "tests/test_train_cli_checks.py",
    "tests/test_nm_train.py",
]
SESSION_TESTS = [
    "tests/test_train.py",
    "tests/test_faults.py",
    "tests/test_train_init_from.py",
    "tests/test_amp.py",
    "tests/test_train_cli_checks.py",
    "tests/test_distributed_checkpoint.py",
    "tests/test_run_metadata.py",
    "tests/test_nm_train.py",
]
CKPT_TESTS = [
    "tests/test_train.py",
    "tests/test_faults.py",
    "tests/test_train_cli_checks.py",
    "tests/test_cli.py",
    "tests/test_distributed_checkpoint.py",
]

#: Every file any mutant runs (the baseline run and the docs' list).
TESTS = list(dict.fromkeys(OPTIM_TESTS + LOOP_TESTS + SESSION_TESTS + CKPT_TESTS))

MUTATIONS = [
    # ------------------------------------------------------------ train/optim.py
    dict(
        id="lp01",
        desc="weight decay on biases and norm parameters too (ndim < 1 exempt, not ndim <= 1)",
        old="(no_decay if param.ndim <= 1 else decay).append(param)",
        new="(no_decay if param.ndim < 1 else decay).append(param)",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp02",
        desc="the Pruner's own parameters (ASL+ thresholds) get weight decay",
        old='{"params": extra, "weight_decay": 0.0}',
        new='{"params": extra, "weight_decay": weight_decay}',
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp03",
        desc="SGD: nesterov from the config ignored (always plain momentum)",
        old="momentum=config.momentum, nesterov=config.nesterov",
        new="momentum=config.momentum, nesterov=False",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp04",
        desc="AdamW: β1 fixed at 0.9 instead of the config's momentum",
        old="betas=(config.momentum, 0.999)",
        new="betas=(0.9, 0.999)",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp05",
        desc="Adam (L2 in the gradient) instead of AdamW (decoupled weight decay)",
        old="return torch.optim.AdamW(groups",
        new="return torch.optim.Adam(groups",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp06",
        desc="warm-up starts at 0: step/W instead of (step + 1)/W",
        old="return (step + 1) / warmup_steps",
        new="return step / warmup_steps",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp07",
        desc="cosine progress over all the steps instead of the steps after the warm-up",
        old="max(1, total_steps - warmup_steps)",
        new="max(1, total_steps)",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp08",
        desc="cosine ends at 0 whatever min_ratio: the floor term dropped",
        old="return min_ratio + (1.0 - min_ratio) * 0.5",
        new="return (1.0 - min_ratio) * 0.5",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp09",
        desc="LR schedule length in epochs instead of iterations (total = epochs)",
        old="total = config.epochs * steps_per_epoch",
        new="total = config.epochs",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp10",
        desc="warm-up length taken in iterations from warmup_epochs (not × steps per epoch)",
        old="warmup = round(config.warmup_epochs * steps_per_epoch)",
        new="warmup = round(config.warmup_epochs)",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp11",
        desc="min_lr taken for the ratio min_lr/lr",
        old="min_ratio = config.min_lr / config.lr",
        new="min_ratio = config.min_lr",
        tests=OPTIM_TESTS,
    ),
    dict(
        id="lp12",
        desc="lr_schedule ignored: always cosine (constant never used)",
        old="schedule=config.lr_schedule,",
        new='schedule="cosine",',
        tests=OPTIM_TESTS,
    ),
    # ------------------------------------------------------------- train/loop.py
    dict(
        id="lp13",
        desc="evaluate: the model left in train mode (BatchNorm batch statistics, dropout)",
        old="    model.eval()\n    device = next(model.parameters()).device",
        new="    device = next(model.parameters()).device",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp14",
        desc="evaluate: per-batch mean loss summed, then divided by the samples",
        old='totals[0] += F.cross_entropy(out.float(), y, reduction="sum")',
        new='totals[0] += F.cross_entropy(out.float(), y, reduction="mean")',
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp15",
        desc="evaluate: loss of autocast (half) logits computed in half, not float32",
        old='F.cross_entropy(out.float(), y, reduction="sum")',
        new='F.cross_entropy(out, y, reduction="sum")',
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp16",
        desc="evaluate: batches counted instead of samples",
        old="totals[2] += y.numel()",
        new="totals[2] += 1",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp17",
        desc="training loss without the recipe's label smoothing",
        old="loss = F.cross_entropy(out, y, label_smoothing=config.label_smoothing)",
        new="loss = F.cross_entropy(out, y)",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp18",
        desc="the backbone's extra loss term (ASL+) not added to the loss",
        old="total = loss if pruner is None else loss + pruner.regularizer()",
        new="total = loss",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp19",
        desc="gradients never zeroed: they accumulate over the steps",
        old="            s.optimizer.zero_grad(set_to_none=True)\n",
        new="",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp20",
        desc="gradient clipping per element (clip_grad_value_) instead of the global norm",
        old="torch.nn.utils.clip_grad_norm_(params, config.grad_clip)",
        new="torch.nn.utils.clip_grad_value_(params, config.grad_clip)",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp21",
        desc="clipping sees only the first parameter group (weights), not biases/norms/thresholds",
        old='params = [p for group in s.optimizer.param_groups for p in group["params"]]',
        new='params = list(s.optimizer.param_groups[0]["params"])',
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp22",
        desc="LR schedule stepped before the optimizer step (each step uses the next step's LR)",
        old=(
            "            s.scaler.step(s.optimizer)\n"
            "            s.scaler.update()\n"
            "            s.scheduler.step()\n"
        ),
        new=(
            "            s.scheduler.step()\n"
            "            s.scaler.step(s.optimizer)\n"
            "            s.scaler.update()\n"
        ),
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp23",
        desc="Pruner stepped before the optimizer step (thresholds from the weights before the update)",
        old=(
            "            s.scaler.step(s.optimizer)\n"
            "            s.scaler.update()\n"
            "            s.scheduler.step()\n"
            "            if pruner is not None:\n"
            "                pruner.step()  # new thresholds from the updated weights\n"
        ),
        new=(
            "            if pruner is not None:\n"
            "                pruner.step()\n"
            "            s.scaler.step(s.optimizer)\n"
            "            s.scaler.update()\n"
            "            s.scheduler.step()\n"
        ),
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp24",
        desc="Pruner stepped once per epoch instead of once per optimizer step",
        old="            if pruner is not None:\n                pruner.step()  #",
        new="            if pruner is not None and i + 1 == s.steps_per_epoch:\n                pruner.step()  #",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp25",
        desc="epoch's training loss: batch means summed, not weighted by the batch size",
        old="stats[0] += loss.detach().double() * y.numel()",
        new="stats[0] += loss.detach().double()",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp26",
        desc="the last epoch not tested when eval_every does not divide epochs",
        old="if every and (epoch % every == 0 or epoch == config.epochs):",
        new="if every and epoch % every == 0:",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp27",
        desc="eval_every = 0: a run stopped early (stop_after_epoch) is not tested",
        old="return epoch == end_epoch < config.epochs",
        new="return False",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp28",
        desc="the report's thresholds not recomputed at the target before finalize (stale with update_every > 1)",
        old="pruner.update(pruner.sparsity)  # the thresholds",
        new="pass  # the thresholds",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp29",
        desc="the checkpoint before is not kept as prev.pt",
        old="save_checkpoint(_checkpoint_state(s, row), path, keep_previous=True)",
        new="save_checkpoint(_checkpoint_state(s, row), path, keep_previous=False)",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp30",
        desc="the saved epoch not recorded after a checkpoint (a later full disk says none was written)",
        old="        ) from err\n    s.saved_epoch = s.epoch\n",
        new="        ) from err\n",
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    dict(
        id="lp31",
        desc="metrics' lr is the config's peak lr, not the optimizer's current one",
        old='"lr": s.optimizer.param_groups[0]["lr"],',
        new='"lr": config.lr,',
        file=LOOP,
        tests=LOOP_TESTS,
    ),
    # ---------------------------------------------------------- train/session.py
    dict(
        id="lp32",
        desc="every run seeded with 0, not with the config's seed",
        old="_seed_everything(config.seed)",
        new="_seed_everything(0)",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp33",
        desc="Pruner built for one epoch's steps instead of the whole training",
        old="build_pruner(config, model, config.epochs * steps_per_epoch)",
        new="build_pruner(config, model, steps_per_epoch)",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp34",
        desc="resume: the Pruner's state not restored",
        old='pruner.load_state_dict(checkpoint["pruner"])',
        new="pass",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp35",
        desc="amp_dtype swapped: bfloat16 asked, float16 used (and the other way)",
        old='amp_dtype = torch.bfloat16 if config.amp_dtype == "bfloat16" else torch.float16',
        new='amp_dtype = torch.float16 if config.amp_dtype == "bfloat16" else torch.bfloat16',
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp36",
        desc="resume: the optimizer's state (momentum) not restored",
        old='    session.optimizer.load_state_dict(checkpoint["optimizer"])\n',
        new="",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp37",
        desc="resume: the LR schedule's position not restored (restarts at step 0)",
        old='    session.scheduler.load_state_dict(checkpoint["lr_scheduler"])\n',
        new="",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp38",
        desc="resume: the step-count check against the steps per epoch dropped",
        old="if session.step != session.epoch * session.steps_per_epoch:",
        new="if False:",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp39",
        desc="resume: the RNG states not restored",
        old='    _set_rng_state(checkpoint["rng"])\n',
        new="",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp40",
        desc="resume: the saved epoch unknown until the next checkpoint",
        old="    session.saved_epoch = session.epoch\n",
        new="",
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp41",
        desc="checkpoint: the model's parametrized keys instead of the plain ones",
        old='"model": pruner.dense_state_dict() if pruner is not None else s.model.state_dict(),',
        new='"model": s.model.state_dict(),',
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    dict(
        id="lp42",
        desc="checkpoint: the epoch's metrics row not stored (a lost metrics line is not restored)",
        old='"metrics": metrics,',
        new='"metrics": None,',
        file=SESSION,
        tests=SESSION_TESTS,
    ),
    # ------------------------------------------------------- train/checkpoint.py
    dict(
        id="lp43",
        desc="numpy's global RNG not seeded",
        old="    np.random.seed(seed % 2**32)\n",
        new="",
        file=CKPT,
        tests=CKPT_TESTS,
    ),
    dict(
        id="lp44",
        desc="Python's RNG state not restored",
        old="    random.setstate((version, tuple(internal), gauss))\n",
        new="",
        file=CKPT,
        tests=CKPT_TESTS,
    ),
    dict(
        id="lp45",
        desc="seed a field a resume may change",
        old='        "recipe",\n    }',
        new='        "recipe",\n        "seed",\n    }',
        file=CKPT,
        tests=CKPT_TESTS,
    ),
    dict(
        id="lp46",
        desc="a checkpoint of another run than config.json's accepted",
        old="    diff = _contradictions(saved, recorded)\n",
        new="    diff = {}\n",
        file=CKPT,
        tests=CKPT_TESTS,
    ),
    dict(
        id="lp47",
        desc="resume_config: the overrides dropped",
        old=".replace(**(overrides or {}))",
        new=".replace()",
        file=CKPT,
        tests=CKPT_TESTS,
    ),
    dict(
        id="lp48",
        desc="--resume given a checkpoint file: the hint for a run's checkpoint turned around",
        old="if path.parent.name == CHECKPOINTS_DIR:",
        new="if path.parent.name != CHECKPOINTS_DIR:",
        file=CKPT,
        tests=CKPT_TESTS,
    ),
]
