"""Mutants of the model architectures (models/*.py): strides, shortcuts, widths, init, pooling."""

R = "src/feather_sparse/models/resnet_cifar.py"
R50 = "src/feather_sparse/models/resnet50.py"
MB = "src/feather_sparse/models/mobilenet.py"
DN = "src/feather_sparse/models/densenet.py"
MX = "src/feather_sparse/models/mixer.py"
SM = "src/feather_sparse/models/small.py"
LY = "src/feather_sparse/models/_layers.py"
RG = "src/feather_sparse/models/_registry.py"

FILE = R
TESTS = [
    "tests/test_models.py",
    "tests/test_nm_models.py",
    "tests/test_model_kwargs_message.py",
]
TIMEOUT = 240
MUTATIONS = [
    # --- resnet_cifar.py
    dict(
        id="md01",
        desc="CIFAR ResNet: stage strides 1, 1, 2 (the second stage does not downsample)",
        old="STAGE_STRIDES = (1, 2, 2)",
        new="STAGE_STRIDES = (1, 1, 2)",
    ),
    dict(
        id="md02",
        desc="BasicBlock: the stride on the second 3x3 conv instead of the first",
        old="""        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)""",
        new="""        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=stride, padding=1, bias=False)""",
    ),
    dict(
        id="md03",
        file=LY,
        desc="residual_shortcut: option-B shortcut without its batch norm (BasicBlock, Bottleneck)",
        old="""            nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
            nn.BatchNorm2d(out_channels),
        )""",
        new="""            nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
        )""",
    ),
    dict(
        id="md04",
        desc="BasicBlock: no ReLU after the residual addition",
        old="return self.relu(out + self.shortcut(x))",
        new="return out + self.shortcut(x)",
    ),
    dict(
        id="md05",
        desc="BasicBlock: no ReLU between the two convs",
        old="out = self.relu(self.bn1(self.conv1(x)))\n        out = self.bn2(",
        new="out = self.bn1(self.conv1(x))\n        out = self.bn2(",
    ),
    dict(
        id="md06",
        desc="CIFAR ResNet: no ReLU after the stem's batch norm",
        old="x = self.relu(self.bn1(self.conv1(x)))  # (N, C0, H, W)",
        new="x = self.bn1(self.conv1(x))  # (N, C0, H, W)",
    ),
    dict(
        id="md07",
        desc="CIFAR ResNet: global max pooling instead of average",
        old="self.pool = nn.AdaptiveAvgPool2d(1)",
        new="self.pool = nn.AdaptiveMaxPool2d(1)",
    ),
    dict(
        id="md08",
        desc="CIFAR ResNet: one block too many per stage",
        old="blocks += [BasicBlock(out, out) for _ in range(blocks_per_stage - 1)]",
        new="blocks += [BasicBlock(out, out) for _ in range(blocks_per_stage)]",
    ),
    dict(
        id="md09",
        desc="resnet20: the width option ignored (always 2)",
        old="return CifarResNet(depth=20, num_classes=num_classes, width=width)",
        new="return CifarResNet(depth=20, num_classes=num_classes, width=2)",
    ),
    # --- resnet50.py
    dict(
        id="md10",
        file=R50,
        desc="ResNet-50: the last stage does not downsample (strides 1, 2, 2, 1)",
        old="STAGE_STRIDES = (1, 2, 2, 2)",
        new="STAGE_STRIDES = (1, 2, 2, 1)",
    ),
    dict(
        id="md11",
        file=R50,
        desc="Bottleneck: the stride on the first 1x1 conv (ResNet v1), not the 3x3 (v1.5)",
        old="""        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)""",
        new="""        self.conv1 = nn.Conv2d(in_channels, width, 1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)""",
    ),
    dict(
        id="md12",
        file=R50,
        desc="zero_init_residual zeroes bn2 instead of the block's last BN (bn3)",
        old="nn.init.zeros_(module.bn3.weight)",
        new="nn.init.zeros_(module.bn2.weight)",
    ),
    dict(
        id="md13",
        file=R50,
        desc="resnet50: zero_init_residual ignored (never applied)",
        old="return ResNet((3, 4, 6, 3), num_classes=num_classes, zero_init_residual=zero_init_residual)",
        new="return ResNet((3, 4, 6, 3), num_classes=num_classes)",
    ),
    dict(
        id="md14",
        file=R50,
        desc="ResNet-50: stem max pool with stride 1",
        old="self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)",
        new="self.maxpool = nn.MaxPool2d(3, stride=1, padding=1)",
    ),
    dict(
        id="md15",
        file=R50,
        desc="ResNet-50: stem 7x7 conv with stride 1",
        old="nn.Conv2d(in_channels, STEM_CHANNELS, 7, stride=2, padding=3, bias=False)",
        new="nn.Conv2d(in_channels, STEM_CHANNELS, 7, stride=1, padding=3, bias=False)",
    ),
    dict(
        id="md16",
        file=R50,
        desc="Bottleneck: no ReLU after bn2",
        old="out = self.relu(self.bn2(self.conv2(out)))",
        new="out = self.bn2(self.conv2(out))",
    ),
    dict(
        id="md17",
        file=LY,
        desc="residual_shortcut: projection without its stride (spatial mismatch; both blocks)",
        old="nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),",
        new="nn.Conv2d(in_channels, out_channels, 1, bias=False),",
    ),
    # --- mobilenet.py
    dict(
        id="md18",
        file=MB,
        desc="MobileNetV1: the first 1024-channel block does not downsample",
        old="    (1024, 2),",
        new="    (1024, 1),",
    ),
    dict(
        id="md19",
        file=MB,
        desc="MobileNetV1: the stride on the pointwise conv instead of the depthwise",
        old="""        self.depthwise = _conv_bn_relu(in_channels, in_channels, 3, stride, groups=in_channels)
        self.pointwise = _conv_bn_relu(in_channels, out_channels, 1, bias=pointwise_bias)""",
        new="""        self.depthwise = _conv_bn_relu(in_channels, in_channels, 3, groups=in_channels)
        self.pointwise = _conv_bn_relu(in_channels, out_channels, 1, stride, bias=pointwise_bias)""",
    ),
    dict(
        id="md20",
        file=MB,
        desc="MobileNetV1: conv-BN without ReLU",
        old="        nn.ReLU(inplace=True),",
        new="        nn.Identity(),",
    ),
    dict(
        id="md21",
        file=MB,
        desc="MobileNetV1: width multiplier not applied to the stem",
        old="prev = scaled(STEM_CHANNELS)",
        new="prev = STEM_CHANNELS",
    ),
    dict(
        id="md22",
        file=MB,
        desc="MobileNetV1: depthwise conv as a full conv (groups=1)",
        old="3, stride, groups=in_channels)",
        new="3, stride, groups=1)",
    ),
    dict(
        id="md23",
        file=MB,
        desc="mobilenet_v1_imagenet: pointwise_bias option ignored (always off)",
        old="return MobileNetV1(num_classes, width_mult, stem_stride=2, pointwise_bias=pointwise_bias)",
        new="return MobileNetV1(num_classes, width_mult, stem_stride=2)",
    ),
    # --- densenet.py
    dict(
        id="md24",
        file=DN,
        desc="DenseNet transition: 2x2 max pooling instead of average",
        old="self.pool = nn.AvgPool2d(2)",
        new="self.pool = nn.MaxPool2d(2)",
    ),
    dict(
        id="md25",
        file=DN,
        desc="DenseNet bottleneck: no ReLU before the 3x3 conv",
        old="out = self.conv2(self.relu(self.bn2(out)))",
        new="out = self.conv2(self.bn2(out))",
    ),
    dict(
        id="md26",
        file=DN,
        desc="DenseNet: no ReLU after the final batch norm",
        old="x = self.relu(self.bn(x))",
        new="x = self.bn(x)",
    ),
    dict(
        id="md27",
        file=DN,
        desc="DenseNet transition: channels rounded up (ceil) instead of floor(θ·C)",
        old="reduced = math.floor(channels * compression)",
        new="reduced = math.ceil(channels * compression)",
    ),
    # --- mixer.py
    dict(
        id="md28",
        file=MX,
        desc="Mixer patches: padding (2, 1) instead of (1, 2)",
        old="PATCH, STRIDE, PAD = 8, 5, (1, 2)",
        new="PATCH, STRIDE, PAD = 8, 5, (2, 1)",
    ),
    dict(
        id="md29",
        file=MX,
        desc="MixerBlock: no residual around the token-mixing MLP",
        old="x = x + self.token2(",
        new="x = 0 * x + self.token2(",
    ),
    dict(
        id="md30",
        file=MX,
        desc="MixerBlock: channel mixing without its batch norm",
        old="y = self.norm2(x.transpose(1, 2)).transpose(1, 2)",
        new="y = x",
    ),
    dict(
        id="md31",
        file=MX,
        desc="Mixer: max over the tokens instead of the mean",
        old="return self.norm(h.mean(dim=1))",
        new="return self.norm(h.amax(dim=1))",
    ),
    # --- small.py
    dict(
        id="md32",
        file=SM,
        desc="MNIST-1D CNN: the last conv with stride 1 instead of 2",
        old="(128, 3, 1), (256, 3, 2))",
        new="(128, 3, 1), (256, 3, 1))",
    ),
    dict(
        id="md33",
        file=SM,
        desc="MNIST-1D CNN: no padding (the signal shrinks at every conv)",
        old="padding=kernel // 2",
        new="padding=0",
    ),
    dict(
        id="md34",
        file=SM,
        desc="MNIST-1D MLP: no ReLU after the hidden layers",
        old="nn.BatchNorm1d(width), nn.ReLU()]",
        new="nn.BatchNorm1d(width)]",
    ),
    dict(
        id="md35",
        file=SM,
        desc="MNIST-1D CNN: global max pooling instead of average",
        old="self.pool = nn.AdaptiveAvgPool1d(1)",
        new="self.pool = nn.AdaptiveMaxPool1d(1)",
    ),
    # --- _layers.py
    dict(
        id="md36",
        file=LY,
        desc="convs: Kaiming fan_in instead of fan_out",
        old='mode="fan_out"',
        new='mode="fan_in"',
    ),
    dict(
        id="md37",
        file=LY,
        desc="hidden linear layers: Kaiming fan_out instead of fan_in",
        old='nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")',
        new='nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")',
    ),
    dict(
        id="md38",
        file=LY,
        desc="classifier bound 1/sqrt(out_features) instead of 1/sqrt(in_features)",
        old="bound = 1.0 / math.sqrt(module.in_features)",
        new="bound = 1.0 / math.sqrt(module.out_features)",
    ),
    dict(
        id="md39",
        file=LY,
        desc="convs: Kaiming with linear gain (1) instead of ReLU's (sqrt 2)",
        old='mode="fan_out", nonlinearity="relu"',
        new='mode="fan_out", nonlinearity="linear"',
    ),
    dict(
        id="md40",
        file=LY,
        desc="batch norm weights initialised to 0.5 instead of 1",
        old="nn.init.ones_(module.weight)",
        new="nn.init.constant_(module.weight, 0.5)",
    ),
    # --- _registry.py
    dict(
        id="md41",
        file=RG,
        desc="create_model: the spec records only the given arguments (defaults not resolved)",
        old="    bound.apply_defaults()\n",
        new="",
    ),
    dict(
        id="md42",
        file=RG,
        desc="create_model: None arguments passed through (they override the defaults)",
        old="args = {k: v for k, v in kwargs.items() if v is not None}\n    classes",
        new="args = dict(kwargs)\n    classes",
    ),
    dict(
        id="md43",
        file=RG,
        desc="create_model: the spec records the caller's spelling of the name",
        old='{"name": entry.info.name, "kwargs": resolved}',
        new='{"name": name, "kwargs": resolved}',
    ),
]
