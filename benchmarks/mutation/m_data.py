"""Mutants of the data pipeline: src/feather_sparse/data/ (the CIFAR reader and
builder, the augmentations and normalisation constants, the seeded and sharded
loaders, the ImageNet folders and transforms, the bundle, the MNIST-1D cache and
the synthetic sets).

A mutant with a ``file`` key mutates that file instead of FILE; a mutant with a
``tests`` key runs those tests instead of TESTS, the most specific first: the
run stops at the first failure (-x). Every set is single-process.
"""

FILE = "src/feather_sparse/data/cifar.py"
AUGMENT = "src/feather_sparse/data/augment.py"
LOADERS = "src/feather_sparse/data/loaders.py"
IMAGENET = "src/feather_sparse/data/imagenet.py"
BASE = "src/feather_sparse/data/base.py"
CACHE = "src/feather_sparse/data/cache.py"
MNIST1D = "src/feather_sparse/data/mnist1d.py"
SYNTHETIC = "src/feather_sparse/data/synthetic.py"
TIMEOUT = 240  # per mutant: a set takes 5-20 s here

TESTS = ["tests/test_data.py"]  # the readers, transforms and loaders
# what trains on the loaders: a resumed run must see the same batches
RESUME = [
    "tests/test_data.py",
    "tests/test_train.py::test_resume_is_bit_identical_to_a_straight_run",
    "tests/test_train.py::test_resume_restores_every_rng",
]
# the cache's damage checks
CACHED = [
    "tests/test_data.py",
    "tests/test_faults.py::test_every_flipped_bit_and_truncation_of_the_cache_is_detected",
    "tests/test_faults.py::test_a_damaged_mnist1d_cache_is_regenerated_with_a_warning",
]

MUTATIONS = [
    # --- CIFAR: the python-format pickles, fine vs coarse labels, the row layout
    dict(
        id="dat01",
        desc="CIFAR-100 read with the coarse labels (20 superclasses) instead of the fine ones",
        old='label_key=b"fine_labels",',
        new='label_key=b"coarse_labels",',
    ),
    dict(
        id="dat02",
        desc="a row read as 32x32 pixels of (r, g, b) (HWC) instead of three 32x32 planes",
        old="return data.reshape(-1, 3, 32, 32), labels",
        new="return data.reshape(-1, 32, 32, 3).transpose(0, 3, 1, 2), labels",
    ),
    dict(
        id="dat03",
        desc="each plane read column-major (the image transposed)",
        old="return data.reshape(-1, 3, 32, 32), labels",
        new="return data.reshape(-1, 3, 32, 32).transpose(0, 1, 3, 2), labels",
    ),
    dict(
        id="dat04",
        desc="the test split read from the training files (train and test mixed)",
        old="return join(spec.train_files), join(spec.test_files)",
        new="return join(spec.train_files), join(spec.train_files)",
    ),
    dict(
        id="dat05",
        desc="a label equal to the number of classes accepted (> instead of >=)",
        old="labels.max() >= spec.num_classes):",
        new="labels.max() > spec.num_classes):",
    ),
    dict(
        id="dat06",
        desc="negative labels accepted (the lower bound dropped)",
        old="labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes)",
        new="labels.size and (labels.max() >= spec.num_classes)",
    ),
    dict(
        id="dat07",
        desc="a batch with more or fewer labels than images accepted",
        old="if labels.shape != (data.shape[0],):",
        new="if False:",
    ),
    dict(
        id="dat08",
        desc="archive members stored as ./cifar-100-python/... not found",
        old='name = wanted.get(member.name.removeprefix("./"))',
        new="name = wanted.get(member.name)",
    ),
    dict(
        id="dat09",
        desc="CIFAR-100 normalised with CIFAR-10's mean",
        old="mean=CIFAR100_MEAN,",
        new="mean=CIFAR10_MEAN,",
    ),
    dict(
        id="dat10",
        desc="the padding option ignored (always 4)",
        old="CropFlipNormalize(mean, std, config.device, padding=padding) if augment else evaluate",
        new="CropFlipNormalize(mean, std, config.device) if augment else evaluate",
    ),
    dict(
        id="dat11",
        desc="mean= and std= reach the training set only (the test set keeps the defaults)",
        old="evaluate = Normalize(mean, std, config.device)",
        new="evaluate = Normalize(spec.mean, spec.std, config.device)",
    ),
    # --- augment.py: the constants, the random crop, the flip, the normalisation
    dict(
        id="dat12",
        desc="CIFAR-10 std: the often-quoted (0.2023, 0.1994, 0.2010) instead of the data's own",
        file=AUGMENT,
        old="CIFAR10_STD = (0.2470, 0.2435, 0.2616)",
        new="CIFAR10_STD = (0.2023, 0.1994, 0.2010)",
    ),
    dict(
        id="dat13",
        desc="CIFAR-100 std in reversed channel order (b, g, r)",
        file=AUGMENT,
        old="CIFAR100_STD = (0.2673, 0.2564, 0.2762)",
        new="CIFAR100_STD = (0.2762, 0.2564, 0.2673)",
    ),
    dict(
        id="dat14",
        desc="ImageNet std in reversed channel order (b, g, r)",
        file=AUGMENT,
        old="IMAGENET_STD = (0.229, 0.224, 0.225)",
        new="IMAGENET_STD = (0.225, 0.224, 0.229)",
    ),
    dict(
        id="dat15",
        desc="crop offsets in 0 .. 2·padding - 1 (the last offset never drawn)",
        file=AUGMENT,
        old="torch.randint(0, 2 * padding + 1, (2, b)",
        new="torch.randint(0, 2 * padding, (2, b)",
    ),
    dict(
        id="dat16",
        desc="one crop offset for both axes (rows' offset used for the columns)",
        file=AUGMENT,
        old="cols = offsets[1, :, None]",
        new="cols = offsets[0, :, None]",
    ),
    dict(
        id="dat17",
        desc="crop padding replicates the border instead of zeros",
        file=AUGMENT,
        old="padded = F.pad(x, (padding, padding, padding, padding))",
        new='padded = F.pad(x, (padding, padding, padding, padding), mode="replicate")',
    ),
    dict(
        id="dat18",
        desc="flip up-down (H) instead of left-right (W)",
        file=AUGMENT,
        old="return torch.where(flip[:, None, None, None], x.flip(3), x)",
        new="return torch.where(flip[:, None, None, None], x.flip(2), x)",
    ),
    dict(
        id="dat19",
        desc="flip with probability 1 - p (rand > p)",
        file=AUGMENT,
        old="flip = (torch.rand(x.shape[0], generator=generator) < p)",
        new="flip = (torch.rand(x.shape[0], generator=generator) > p)",
    ),
    dict(
        id="dat20",
        desc="flip=False ignored (always flipped at random)",
        file=AUGMENT,
        old="if self.flip:",
        new="if True:",
    ),
    dict(
        id="dat21",
        desc="normalised before the crop (the padding is the mean, not black)",
        file=AUGMENT,
        old=(
            "x = random_crop(x, self.padding, generator)\n"
            "        if self.flip:\n"
            "            x = random_hflip(x, generator)\n"
            "        return super().__call__(x)"
        ),
        new=(
            "x = random_crop(super().__call__(x), self.padding, generator)\n"
            "        if self.flip:\n"
            "            x = random_hflip(x, generator)\n"
            "        return x"
        ),
    ),
    # --- loaders.py: seeds, shards, batch counts
    dict(
        id="dat22",
        desc="derive_seed mixes each part alone and XORs them (order lost: seed s, epoch e = seed e, epoch s)",
        file=LOADERS,
        old="h = _splitmix64(h ^ (part & _MASK64))",
        new="h = h ^ _splitmix64(part & _MASK64)",
        tests=RESUME,
    ),
    dict(
        id="dat23",
        desc="shuffle ignores the epoch (every epoch the same order)",
        file=LOADERS,
        old="epoch_generator(seed, epoch, SHUFFLE_STREAM)",
        new="epoch_generator(seed, SHUFFLE_STREAM)",
        tests=RESUME,
    ),
    dict(
        id="dat24",
        desc="augmentation ignores the epoch (a sample gets the same crop every epoch)",
        file=LOADERS,
        old="epoch_generator(self.seed, self.epoch, AUGMENT_STREAM, self.rank)",
        new="epoch_generator(self.seed, AUGMENT_STREAM, self.rank)",
        tests=RESUME,
    ),
    dict(
        id="dat25",
        desc="augmentation ignores the rank (ranks share crop offsets batch for batch)",
        file=LOADERS,
        old="epoch_generator(self.seed, self.epoch, AUGMENT_STREAM, self.rank)",
        new="epoch_generator(self.seed, self.epoch, AUGMENT_STREAM)",
        tests=RESUME,
    ),
    dict(
        id="dat26",
        desc="train cut to whole local batches, not global ones (a rank's num_samples and indices() count samples no batch holds)",
        file=LOADERS,
        old="order = order[: (n // global_batch) * global_batch]",
        new="order = order[: (n // batch_size) * batch_size]",
        tests=RESUME,
    ),
    dict(
        id="dat27",
        desc="plain slices for every unshuffled loader (a rank's test shard ignored)",
        file=LOADERS,
        old="identity = not self.shuffle and self.world_size == 1",
        new="identity = not self.shuffle",
        tests=RESUME,
    ),
    dict(
        id="dat28",
        desc="test batches counted with floor (the incomplete last test batch dropped)",
        file=LOADERS,
        old="return math.ceil(shard / batch_size)",
        new="return shard // batch_size",
        tests=RESUME,
    ),
    # --- imagenet.py: labels, the Inception crop, the flip, the eval resize and crop
    dict(
        id="dat29",
        desc="val labels from val/'s own sorted folders (shifted when val/ lacks a class)",
        file=IMAGENET,
        old='val_samples = _scan(root / "val", classes, require_all=False)',
        new='val_samples = _scan(root / "val", find_classes(root / "val"), require_all=False)',
    ),
    dict(
        id="dat30",
        desc="aspect ratio uniform in 3/4..4/3 instead of log-uniform",
        file=IMAGENET,
        old="aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio)",
        new="aspect = self.ratio[0] + (self.ratio[1] - self.ratio[0]) * u_ratio",
    ),
    dict(
        id="dat31",
        desc="crop top in 0 .. height - h - 1 (the last row offset never drawn)",
        file=IMAGENET,
        old="top = min(int(u_top * (height - h + 1)), height - h)",
        new="top = min(int(u_top * (height - h)), height - h)",
    ),
    dict(
        id="dat32",
        desc="fallback for a tall image: h = width·(3/4) instead of width/(3/4)",
        file=IMAGENET,
        old="w, h = width, round(width / self.ratio[0])",
        new="w, h = width, round(width * self.ratio[0])",
    ),
    dict(
        id="dat33",
        desc="training images never flipped (< 0.0)",
        file=IMAGENET,
        old="flip = bool(torch.rand(1, generator=generator).item() < 0.5)",
        new="flip = bool(torch.rand(1, generator=generator).item() < 0.0)",
    ),
    dict(
        id="dat34",
        desc="eval crop from the top instead of the centre",
        file=IMAGENET,
        old="top = round((new_h - self.size) / 2)",
        new="top = 0",
    ),
    dict(
        id="dat35",
        desc="eval resizes the longer side to 256 instead of the shorter",
        file=IMAGENET,
        old="if width <= height:",
        new="if width >= height:",
    ),
    dict(
        id="dat36",
        desc="a sample's crop seed ignores the epoch (the same crop every epoch)",
        file=IMAGENET,
        old="derive_seed(self.seed, self.epoch, AUGMENT_STREAM, i)",
        new="derive_seed(self.seed, AUGMENT_STREAM, i)",
    ),
    # --- base.py: the bundle's two loaders
    dict(
        id="dat37",
        desc="the test loader gets the training batch size (eval_batch_size ignored)",
        file=BASE,
        old="batch_size=config.eval_batch_size,",
        new="batch_size=config.batch_size,",
        tests=RESUME,
    ),
    dict(
        id="dat38",
        desc="the test loader not sharded (every rank evaluates the whole test set)",
        file=BASE,
        old="drop_last=False,\n        transform=test_transform,\n        **common,",
        new="drop_last=False,\n        transform=test_transform,\n        seed=config.seed,",
        tests=RESUME,
    ),
    # --- cache.py and mnist1d.py: the cache's integrity checks
    dict(
        id="dat39",
        desc="the cache's SHA-256 seal not checked",
        file=CACHE,
        old='check_zip_seal(data, f"cache {path}")',
        new="None",
        tests=CACHED,
    ),
    dict(
        id="dat40",
        desc="a cache with the wrong shapes used",
        file=MNIST1D,
        old="if shapes != _SHAPES:",
        new="if False:",
        tests=CACHED,
    ),
    dict(
        id="dat41",
        desc="a cache that lacks an array raises KeyError instead of being regenerated",
        file=MNIST1D,
        old="except (OSError, ValueError, KeyError) as err:",
        new="except (OSError, ValueError) as err:",
        tests=CACHED,
    ),
    dict(
        id="dat42",
        desc="a cache that cannot be written stops the run (OSError not caught)",
        file=MNIST1D,
        old="except OSError as err:  # a read-only cache must not stop training",
        new="except ValueError as err:  # a read-only cache must not stop training",
        tests=CACHED,
    ),
    dict(
        id="dat43",
        desc="numpy's global RNG not restored after generating",
        file=MNIST1D,
        old="np.random.set_state(numpy_state)",
        new="None",
        tests=CACHED,
    ),
    # --- synthetic.py: a pure function of the seed, train and test apart
    dict(
        id="dat44",
        desc="synthetic data ignores the seed",
        file=SYNTHETIC,
        old="derive_seed(config.seed, _SYNTHETIC_STREAM)",
        new="derive_seed(_SYNTHETIC_STREAM)",
        tests=RESUME,
    ),
    dict(
        id="dat45",
        desc="synthetic test set drawn from the restarted generator (= the first training samples)",
        file=SYNTHETIC,
        old="    train = draw(train_size)\n    test = draw(test_size)",
        new=(
            "    test = draw(test_size)\n"
            "    generator.manual_seed(derive_seed(config.seed, _SYNTHETIC_STREAM))\n"
            "    train = draw(train_size)"
        ),
        tests=RESUME,
    ),
]
