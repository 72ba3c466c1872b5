"""Mutants of sparse inference and the N:M export: src/feather_sparse/export/inference.py
(the CSR layers, their int32 indices and bias, the conversion's rules: min_sparsity,
min_weights, dtypes, which convolutions qualify, the timed decision) and
src/feather_sparse/nm/export.py (encode_nm / decode_nm / nm_encoded_bytes and the
CPU-checkable parts of to_semi_structured: its checks and which layers it picks).

A mutant with a ``file`` key mutates that file instead of FILE; each mutant runs its
own ``tests`` (the files that reach its code, the most specific first): the run stops
at the first failure (-x).
"""

FILE = "src/feather_sparse/export/inference.py"
NMX = "src/feather_sparse/nm/export.py"
TIMEOUT = 300  # per mutant: the whole list takes about 5 minutes on a shared 2-core machine

INF_TESTS = ["tests/test_export.py"]
NM_TESTS = [
    "tests/test_nm_export.py",
    "tests/test_cuda_paths.py",
    "tests/test_nm_fsp.py",
    "tests/test_mutation_gaps.py",
]
TESTS = INF_TESTS + NM_TESTS

MUTATIONS = [
    # --- the CSR layers
    dict(
        id="inf01",
        desc="CSR weight keeps int64 indices (to_sparse_csr's own)",
        old="    return torch.sparse_csr_tensor(\n        csr.crow_indices()",
        new="    return csr\n    return torch.sparse_csr_tensor(\n        csr.crow_indices()",
        tests=INF_TESTS,
    ),
    dict(
        id="inf02",
        desc="bias dropped from the CSR product (mm instead of addmm)",
        old="return torch.addmm(bias_column, weight_csr, columns)",
        new="return torch.mm(weight_csr, columns)",
        tests=INF_TESTS,
    ),
    dict(
        id="inf03",
        desc="SparseLinear's bias shares the dense layer's storage (no clone)",
        old="column = None if bias is None else bias.detach().reshape(-1, 1).clone()",
        new="column = None if bias is None else bias.detach().reshape(-1, 1)",
        occ=1,
        tests=INF_TESTS,
    ),
    dict(
        id="inf04",
        desc="SparseLinear's output not made contiguous",
        old="return out.t().contiguous().reshape(*x.shape[:-1], self.out_features)",
        new="return out.t().reshape(*x.shape[:-1], self.out_features)",
        tests=INF_TESTS,
    ),
    dict(
        id="inf05",
        desc="strided 1x1 conv subsamples from offset 1 instead of 0",
        old="slice(None, None, s) for s in self.stride",
        new="slice(1, None, s) for s in self.stride",
        tests=INF_TESTS,
    ),
    dict(
        id="inf06",
        desc="unbatched conv input treated as batched",
        old="batched = x.dim() == spatial_dims + 2",
        new="batched = True",
        tests=INF_TESTS,
    ),
    # --- which layers qualify
    dict(
        id="inf07",
        desc="grouped 1x1 convolutions qualify (groups check dropped)",
        old="module.kernel_size) and module.groups == 1 and no_padding",
        new="module.kernel_size) and no_padding",
        tests=INF_TESTS,
    ),
    dict(
        id="inf08",
        desc="padded 1x1 convolutions qualify (padding check dropped)",
        old="module.kernel_size) and module.groups == 1 and no_padding",
        new="module.kernel_size) and module.groups == 1",
        tests=INF_TESTS,
    ),
    dict(
        id="inf09",
        desc="float16/bfloat16 weights qualify (dtype rule dropped)",
        old="if not isinstance(weight, Tensor) or weight.dtype not in (torch.float32, torch.float64):",
        new="if not isinstance(weight, Tensor):",
        tests=INF_TESTS,
    ),
    dict(
        id="inf10",
        desc="a layer of exactly min_weights weights stays dense (< became <=)",
        old="if numel < max(min_weights, 1):",
        new="if numel <= max(min_weights, 1):",
        tests=INF_TESTS,
    ),
    dict(
        id="inf11",
        desc="a layer at exactly min_sparsity stays dense (>= became >)",
        old="if sparsity >= min_sparsity:",
        new="if sparsity > min_sparsity:",
        tests=INF_TESTS,
    ),
    dict(
        id="inf12",
        desc="density compared with min_sparsity instead of sparsity",
        old="sparsity = zeros / numel",
        new="sparsity = (numel - zeros) / numel",
        tests=INF_TESTS,
    ),
    dict(
        id="inf13",
        desc="the model converted in place by default (deepcopy condition inverted)",
        old="    if not inplace:\n        model = copy.deepcopy(model)",
        new="    if inplace:\n        model = copy.deepcopy(model)",
        tests=INF_TESTS,
    ),
    # --- the timed decision
    dict(
        id="inf14",
        desc="timed decision inverted: converted when sparse is slower",
        old="if sparse_s >= dense_s:",
        new="if sparse_s <= dense_s:",
        tests=INF_TESTS,
    ),
    dict(
        id="inf15",
        desc="a layer that did not run on the example input is converted",
        old='"%s stays dense: it did not run on the example input", name)\n            continue',
        new='"%s stays dense: it did not run on the example input", name)',
        tests=INF_TESTS,
    ),
    dict(
        id="inf16",
        desc="the timing hooks are left on the model",
        old="            for hook in hooks:\n                hook.remove()",
        new="            for hook in hooks:\n                pass",
        tests=INF_TESTS,
    ),
    # --- argument checks
    dict(
        id="inf17",
        desc="min_sparsity above 1 accepted",
        old="if not 0.0 <= min_sparsity <= 1.0:",
        new="if not 0.0 <= min_sparsity:",
        tests=INF_TESTS,
    ),
    dict(
        id="inf18",
        desc="repeats=0 accepted",
        old="if repeats < 1:",
        new="if repeats < 0:",
        tests=INF_TESTS,
    ),
    dict(
        id="inf19",
        desc="min_sparsity=True accepted as 1",
        old="if isinstance(min_sparsity, bool) or not isinstance(min_sparsity, int | float):",
        new="if not isinstance(min_sparsity, int | float):",
        tests=INF_TESTS,
    ),
    # --- encode_nm / decode_nm / nm_encoded_bytes
    dict(
        id="inf20",
        desc="encode: a NaN counts as a zero (abs() > 0 instead of != 0)",
        old="nonzero = groups != 0  # NaN counts as a value",
        new="nonzero = groups.abs() > 0  # NaN counts as a value",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf21",
        desc="encode: -0.0 at a pruned position accepted (< 0 instead of signbit)",
        old="if torch.signbit(dropped).any():",
        new="if (dropped < 0).any():",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf22",
        desc="encode: a group with n+1 nonzeros passes the check",
        old="if bool((counts > pattern.n).any()):",
        new="if bool((counts > pattern.n + 1).any()):",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf23",
        desc="decode: a shape whose size is not a multiple of m passes the size check",
        old="if numel % pattern.m or values.shape != (groups, pattern.n):",
        new="if values.shape != (groups, pattern.n):",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf24",
        desc="decode: index-byte count checked without n (too few bytes pass)",
        old="if indices.numel() * 8 < groups * pattern.n * pattern.index_bits:",
        new="if indices.numel() * 8 < groups * pattern.index_bits:",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf25",
        desc="decode: a position equal to m passes (> instead of >=)",
        old="bad = (positions >= pattern.m).any(1)",
        new="bad = (positions > pattern.m).any(1)",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf26",
        desc="decode: a repeated position passes (< instead of <=)",
        old="bad |= (positions[:, 1:] <= positions[:, :-1]).any(1)",
        new="bad |= (positions[:, 1:] < positions[:, :-1]).any(1)",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf27",
        desc="decode: floats scattered as floats, not as bit patterns",
        old="bits = _BITS_DTYPES.get(values.element_size()) if values.is_floating_point() else None",
        new="bits = None",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf28",
        desc="nm_encoded_bytes: index bytes rounded down",
        old="math.ceil(kept * pattern.index_bits / 8)",
        new="kept * pattern.index_bits // 8",
        file=NMX,
        tests=NM_TESTS,
    ),
    # --- to_semi_structured (CPU-checkable parts)
    dict(
        id="inf29",
        desc="to_semi_structured: a 3:4 layer converted (at most 3 nonzeros per group)",
        old="((group_view(w, pattern) != 0).sum(1) > 2).any()",
        new="((group_view(w, pattern) != 0).sum(1) > 3).any()",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf30",
        desc="to_semi_structured: float32 weights accepted",
        old="w.dtype not in (torch.float16, torch.bfloat16):\n            raise",
        new="w.dtype not in (torch.float16, torch.bfloat16, torch.float32):\n            raise",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf31",
        desc="to_semi_structured: an attached Pruner not detected (checks the bias)",
        old='if parametrize.is_parametrized(module, "weight"):',
        new='if parametrize.is_parametrized(module, "bias"):',
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf32",
        desc="to_semi_structured: a ValueError from the kernels propagates (only RuntimeError caught)",
        old="except (RuntimeError, ValueError) as err:",
        new="except RuntimeError as err:",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf33",
        desc="to_semi_structured: the weight handed to the kernels not made contiguous",
        old="from_dense(w.detach().contiguous())",
        new="from_dense(w.detach())",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf34",
        desc="backend: compute capability 7.x accepted",
        old="if major < 8:",
        new="if major < 7:",
        file=NMX,
        tests=NM_TESTS,
    ),
    dict(
        id="inf35",
        desc="backend: CUTLASS alone accepted on 9.x (major != 8 became major < 8)",
        old="if major != 8:",
        new="if major < 8:",
        file=NMX,
        tests=NM_TESTS,
    ),
]
