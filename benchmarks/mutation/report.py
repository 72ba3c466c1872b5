"""The tables of docs/mutation-audit.md from the harness's results (results/*.jsonl)."""

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

LOC = {
    "ops01": "`_block`",
    "ops02": "`_block` (p = ∞)",
    "ops03": "`_block` (p = 1)",
    "ops04": "`_block` (p = 1)",
    "ops05": "`_block`",
    "ops06": "`_block` (Horner)",
    "ops07": "`_block`",
    "ops08": "`_block`",
    "ops09": "`_block` (expm1 path)",
    "ops10": "`_block`",
    "ops11": "`compute_dtype`",
    "ops12": "`_ThresholdSTE.backward`",
    "ops13": "`_factor_into`",
    "ops14": "`_factor_into`",
    "ops15": "`_factor_into`",
    "ops16": "`_grad_factor`",
    "ops17": "`_ThresholdSTE.backward`",
    "ops18": "`_forward` (blockwise)",
    "ops19": "`_scaled_grad`",
    "ops20": "`_unreferenced`",
    "ops21": "`OutputCache.get`",
    "ops22": "`threshold`",
    "ops23": "`_ThresholdSTE.setup_context`",
    "ops24": "`_forward` (blockwise)",
    "ops25": "`_forward`",
    "nm01": "`_keys`",
    "nm02": "`_keys` (float64)",
    "nm03": "`_keys` (float32)",
    "nm04": "`nm_keep_mask`",
    "nm05": "`nm_keep_mask`",
    "nm06": "`_kth_of_four`",
    "nm07": "`_kth_of_four`",
    "nm08": "`_kth_of_four`",
    "nm09": "`_kth_smallest`",
    "nm10": "`_kth_smallest`",
    "nm11": "`group_thresholds`",
    "nm12": "`group_thresholds`",
    "nm13": "`_nm_forward` (hard)",
    "nm14": "`_nm_forward` (hard)",
    "nm15": "`_nm_forward` (finite p)",
    "nm16": "`_nm_forward` (mask)",
    "nm17": "`_threshold_blocks`",
    "nm18": "`_NMThresholdSTE.backward`",
    "nm19": "`_NMThresholdSTE.backward`",
    "nm20": "`_NMThresholdSTE.backward`",
    "nm21": "`_NMThresholdSTE.backward`",
    "nm22": "`_NMThresholdSTE.backward`",
    "nm23": "`_NMThresholdSTE.backward`",
    "nm24": "`_nm_forward`",
    "nm25": "`_threshold_blocks`",
    "sel01": "`_window_pass`",
    "sel02": "`_window_pass`",
    "sel03": "`select_threshold`",
    "sel04": "`_select`",
    "sel05": "`_select`",
    "sel06": "`_select` (histogram)",
    "sel07": "`_select` (histogram)",
    "sel08": "`_select`",
    "sel09": "`_select`",
    "sel10": "`_select`",
    "sel11": "`_work_dtype`",
    "sel12": "`_magnitudes`",
    "sel13": "`_chunks`",
    "sel14": "`_select_masked`",
    "sel15": "`_window_pass`",
    "sel16": "`_per_tensor_max`",
    "sel17": "`_histogram`",
    "sel18": "`_select`",
    "sel19": "`_select`",
    "sel20": "`_select`",
    "sel21": "`_split_evenly`",
    "sel22": "`_sample_window`",
    "sel23": "`_select` (hint)",
    "sel24": "`_window_pass`",
    "cod01": "`_encode_gaps`",
    "cod02": "`_encode_gaps`",
    "cod03": "`_decode_gaps`",
    "cod04": "`_decode_gaps`",
    "cod05": "`_decode_gaps`",
    "cod06": "`_decode_gaps`",
    "cod07": "`_decode_bitmask`",
    "cod08": "`_decode_bitmask`",
    "cod09": "`_encode_pattern`",
    "cod10": "`_encode_pattern`",
    "cod11": "`_encode_values`",
    "cod12": "`_encode_values`",
    "cod13": "`_decode_values`",
    "cod14": "`_decode_values`",
    "cod15": "`_nm_candidates`",
    "cod16": "`_nm_candidates`",
    "cod17": "`_nm_indices_length`",
    "cod18": "`_encode_nm`",
    "cod19": "`_decode_nm`",
    "cod20": "`_decode_nm`",
    "cod21": "`_from_bytes`",
    "cod22": "`_lzma_decompress`",
    "cod23": "`_decode_bitmask`",
    "cod24": "`_decode_values`",
    "cod25": "`_decode_values`",
    "dist01": "`shard_cuts`",
    "dist02": "`shard_cuts`",
    "dist03": "`shard_cuts`",
    "dist04": "`whole_on_first`",
    "dist05": "`whole_on_first`",
    "dist06": "`_sharded_dims`",
    "dist07": "`shard_group`",
    "dist08": "`common_shard_group`",
    "dist09": "`_counted`",
    "dist10": "`_counted`",
    "dist11": "`_counted`",
    "dist12": "`_counted`",
    "dist13": "`local_weights`",
    "dist14": "`local_weights`",
    "dist15": "`local_weights`",
    "dist16": "`shard_like`",
    "nmsplit01": "`_splits_groups`",
    "nmsplit02": "`_splits_groups`",
    "nmsplit03": "`_splits_groups`",
    "nmsplit04": "`_group_dim`",
    "nmsplit05": "`_group_dim`",
    "nmrep01": "`NMBackbone.report_thresholds`",
    "nmbeta01": "`NMBackbone._rescale_factors`",
    "nmbeta02": "`NMBackbone._rescale_factors`",
    "nmbeta03": "`NMBackbone._rescale_factors`",
    "sch01": "`CubicSchedule.ramp`",
    "sch02": "`CubicSchedule.ramp`",
    "sch03": "`_window`",
    "sch04": "`Schedule.__call__`",
    "sch05": "`Schedule.__call__`",
    "sch06": "`Schedule.__call__`",
    "sch07": "`ConstantSchedule.__post_init__`",
    "sch08": "`_window`",
    "bb01": "`flops_scale`",
    "bb02": "`GlobalFlopsBackbone.thresholds`",
    "bb03": "`GlobalFlopsBackbone.thresholds`",
    "bb04": "`allocate`",
    "bb05": "`UniformBackbone.thresholds`",
    "bb06": "`UniformBackbone.thresholds`",
    "bb07": "`ASLPlusBackbone.advance`",
    "bb08": "`ASLPlusBackbone.implied_sparsities`",
    "bb09": "`ASLPlusBackbone.regularizer`",
    "bb10": "`ASLPlusBackbone.regularizer`",
    "bb11": "`ASLPlusBackbone.forward_weight`",
    "bb12": "`_ThresholdSurrogate.backward`",
    "bb13": "`_ThresholdSurrogate.backward`",
    "bb14": "`ASLPlusBackbone.forward_weight`",
    "bb15": "`ASLPlusBackbone.allocation`",
    "bb16": "`layer_thresholds_at_most`",
    "bl01": "`ST3_C`",
    "bl02": "`st3_rescale`",
    "bl03": "`st3_rescale`",
    "bl04": "`_ST3Function.forward`",
    "bl05": "`_SoftTopKMask.backward`",
    "bl06": "`_SoftTopKMask.backward`",
    "bl07": "`SpartanBackbone.beta_at`",
    "bl08": "`SpartanBackbone.thresholds`",
    "bl09": "`SpartanBackbone._freeze`",
    "bl10": "`SpartanBackbone.__init__`",
    "bl11": "`SpartanBackbone.forward_weight`",
    "me01": "`METHODS` (gmp)",
    "me02": "`METHODS` (spartan)",
    "me03": "`Method.pruner_kwargs`",
    "me04": "`pruner_config`",
    "nmb01": "`SR_STE_DECAY` (nm/methods.py)",
    "nmb02": "`NMBackbone.forward_weight` (fused path)",
    "nmb03": "`NMBackbone.forward_weight` (channels)",
    "nmb04": "`NMBackbone.forward_weight` (fused path)",
    "nmb05": "`NMBackbone.thresholds`",
    "nmb06": "`NMBackbone._rescale_factors`",
    "nmb07": "`NMBackbone._rescale_factors`",
    "nmb08": "`NMBackbone._rescale_factors`",
    "nmb09": "`NMBackbone._rescale_factors`",
    "nmb10": "`FusedNMForward._compute`",
    "nmb11": "`NMBackbone.forward_weight` (fused path)",
    "nmb12": "`NMBackbone.thresholds`",
    "nmb13": "`NMBackbone.forward_weight`",
    "nmb14": "`NMBackbone.forward_weight`",
    "nmb15": "`ONESHOT_START` (nm/methods.py)",
    "nmb16": "`NMBackbone.advance`",
    "nmb17": "`NMBackbone.advance`",
    "nmb18": "`NMBackbone.thresholds`",
    "nmb19": "`NMBackbone.load_state_dict`",
    "nmb20": "`NMBackbone.load_state_dict`",
    "nmb21": "`NMBackbone.state_dict`",
    "nmb22": "`NMBackbone.report_thresholds`",
    "nmb23": "`NMBackbone.keep_mask`",
    "nmb24": "`NMBackbone.pruned_mask`",
    "nmb25": "`NMBackbone.pruned_mask`",
    "nmb26": "`FusedNMForward._valid`",
    "nmb27": "`FusedNMForward._valid`",
    "nmb28": "`FusedNMForward._alone`",
    "nmb29": "`FusedNMForward._compute`",
    "nmb30": "`same_bits`",
    "nmb31": "`FusedNMForward._compute`",
    "keys01": "`_save_hook`",
    "keys02": "`_save_hook` (rename in place)",
    "keys03": "`_save_hook`",
    "keys04": "`install`",
    "keys05": "`install`",
    "keys06": "`install`",
    "keys07": "`_PlainLoad.pre`",
    "keys08": "`_same_tensor`",
    "keys09": "`_PlainLoad.pre`",
    "keys10": "`_PlainLoad.pre`",
    "keys11": "`_PlainLoad.pre`",
    "keys12": "`_PlainLoad.post`",
    "keys13": "`_PlainLoad.post`",
    "keys14": "`_PlainLoad.post`",
    "keys15": "`_PlainLoad.post`",
    "keys16": "`_AttributeHandle.remove`",
    "keys17": "`_FqnModifiers.__call__`",
    "keys18": "`check_zip_seal` (integrity.py)",
    "keys19": "`check_zip_seal` (integrity.py)",
    "keys20": "`_json_digest` (integrity.py)",
    "keys21": "`write_sealed_json` (integrity.py)",
    "keys22": "`write_atomic` (integrity.py)",
    "keys23": "`write_atomic` (integrity.py)",
    "keys24": "`_DISK_FULL` (integrity.py)",
    "keys25": "`write_atomic` (integrity.py)",
    "keys26": "`write_atomic` (integrity.py)",
    "keys27": "`_load_checkpoint` (run_files.py)",
    "keys28": "`_load_checkpoint` (run_files.py)",
    "keys29": "`_field_problem` (run_files.py)",
    "keys30": "`_field_problem` (run_files.py)",
    "keys31": "`_RNG_FIELDS` (run_files.py)",
    "keys32": "`_PRUNER_FIELDS` (run_files.py)",
    "keys33": "`_load_checkpoint` (run_files.py)",
    "keys34": "`load_torch_bytes` (run_files.py)",
    "keys35": "`read_latest_checkpoint` (run_files.py)",
    "keys36": "`read_latest_checkpoint` (run_files.py)",
    "keys37": "`_fall_back` (run_files.py)",
    "keys38": "`_fall_back` (run_files.py)",
    "fsp01": "`_storage_key`",
    "fsp02": "`_storage_key`",
    "fsp03": "`_storage_key`",
    "fsp04": "`save_sparse`",
    "fsp05": "`_decode_all`",
    "fsp06": "`_decode_record`",
    "fsp07": "`_decode_record`",
    "fsp08": "`_decode_nm_record`",
    "fsp09": "`_read`",
    "fsp10": "`_read`",
    "fsp11": "`_read`",
    "fsp12": "`_read`",
    "fsp13": "`_state_as_finalized`",
    "fsp14": "`_state_as_finalized`",
    "fsp15": "`_without_compile_prefix`",
    "fsp16": "`_without_compile_prefix`",
    "fsp17": "`_cast_to_file_dtypes`",
    "fsp18": "`_cast_to_file_dtypes`",
    "fsp19": "`_differences` (`_check_architecture`)",
    "fsp20": "`_differences` (`_check_architecture`)",
    "fsp21": "`_check_aliases` (header.py)",
    "fsp22": "`_check_aliases` (header.py)",
    "fsp23": "`_check_aliases` (header.py)",
    "fsp24": "`_check_aliases` (header.py)",
    "fsp25": "`_parse_header` (header.py)",
    "fsp26": "`TensorRecord.from_json` (header.py)",
    "fsp27": "`SparseFileInfo.stored` (header.py)",
    "fsp28": "`TensorRecord.entropy_bound_bytes` (header.py)",
    "fsp29": "`file_version` (header.py)",
    "fsp30": "`file_version` (header.py)",
    "fsp31": "`_check_format` (header.py)",
    "fsp32": "`_sparsity` (header.py)",
    "fsp33": "`_binary_entropy` (header.py)",
    "fsp34": "`TensorRecord.pattern_entropy_bytes` (header.py)",
    "fsp35": "`TensorRecord.raw_value_bytes` (header.py)",
    "pr01": "`Pruner.step`",
    "pr02": "`Pruner.step`",
    "pr03": "`Pruner.step`",
    "pr04": "`Pruner.update`",
    "pr05": "`Pruner.scheduled_sparsity`",
    "pr06": "`Pruner.scheduled_sparsity`",
    "pr07": "`Pruner._compute_thresholds`",
    "pr08": "`Pruner._compute_thresholds`",
    "pr09": "`Pruner._compute_thresholds`",
    "pr10": "`_abs_max_each`",
    "pr11": "`Pruner._compute_thresholds`",
    "pr12": "`Pruner.finalize`",
    "pr13": "`Pruner.finalize`",
    "pr14": "`Pruner.finalize`",
    "pr15": "`Pruner.finalize`",
    "pr16": "`Pruner.finalize`",
    "pr17": "`Pruner.load_state_dict`",
    "pr18": "`Pruner.load_state_dict`",
    "pr19": "`Pruner.load_state_dict`",
    "pr20": "`Pruner.state_dict`",
    "pr21": "`Pruner._MUST_MATCH`",
    "pr22": "`_check_state`",
    "pr23": "`_check_state`",
    "pr24": "`Pruner._differing_settings`",
    "pr25": "`Pruner.report`",
    "pr26": "`Pruner.report`",
    "pr27": "`Pruner.thresholds`",
    "pr28": "`Pruner.remove`",
    "prcfg01": "`auto_theta` (pruner_config.py)",
    "prcfg02": "`auto_theta` (pruner_config.py)",
    "prcfg03": "`AUTO_THETA_BOUNDARY` (pruner_config.py)",
    "prcfg04": "`auto_theta` (pruner_config.py)",
    "prcfg05": "`PrunerConfig.theta_value`",
    "prcfg06": "`PrunerConfig` (defaults)",
    "prcfg07": "`PrunerConfig` (defaults)",
    "prcfg08": "`PrunerConfig.make_schedule`",
    "prcfg09": "`PrunerConfig.__post_init__`",
    "prcfg10": "`_int_at_least` (pruner_config.py)",
    "prcfg11": "`PrunerConfig.__post_init__`",
    "prcfg12": "`PrunerConfig.__post_init__`",
    "prcfg13": "`_resolve_operator` (pruner_config.py)",
    "prcfg14": "`_resolve_operator` (pruner_config.py)",
    "inf01": "`_to_csr_int32`",
    "inf02": "`_csr_matmul`",
    "inf03": "`SparseLinear.__init__`",
    "inf04": "`SparseLinear.forward`",
    "inf05": "`SparsePointwiseConv.forward`",
    "inf06": "`SparsePointwiseConv.forward`",
    "inf07": "`_is_pointwise_conv`",
    "inf08": "`_is_pointwise_conv`",
    "inf09": "`to_sparse_inference` (eligibility)",
    "inf10": "`to_sparse_inference` (eligibility)",
    "inf11": "`to_sparse_inference` (eligibility)",
    "inf12": "`to_sparse_inference` (eligibility)",
    "inf13": "`to_sparse_inference`",
    "inf14": "`to_sparse_inference` (timed decision)",
    "inf15": "`to_sparse_inference` (timed decision)",
    "inf16": "`to_sparse_inference` (timed decision)",
    "inf17": "`to_sparse_inference` (checks)",
    "inf18": "`to_sparse_inference` (checks)",
    "inf19": "`to_sparse_inference` (checks)",
    "inf20": "`encode_nm` (nm/export.py)",
    "inf21": "`encode_nm` (nm/export.py)",
    "inf22": "`encode_nm` (nm/export.py)",
    "inf23": "`decode_nm` (nm/export.py)",
    "inf24": "`decode_nm` (nm/export.py)",
    "inf25": "`_check_positions` (nm/export.py)",
    "inf26": "`_check_positions` (nm/export.py)",
    "inf27": "`decode_nm` (nm/export.py)",
    "inf28": "`nm_encoded_bytes` (nm/export.py)",
    "inf29": "`to_semi_structured` (nm/export.py)",
    "inf30": "`to_semi_structured` (nm/export.py)",
    "inf31": "`to_semi_structured` (nm/export.py)",
    "inf32": "`to_semi_structured` (nm/export.py)",
    "inf33": "`to_semi_structured` (nm/export.py)",
    "inf34": "`_semi_structured_backend` (nm/export.py)",
    "inf35": "`_semi_structured_backend` (nm/export.py)",
}
EQUIV = {
    "ops13": "equivalent: with `a = sign(|w| − T) ∈ {−1, 0, 1}` and θ ∈ [0, 1], `θ + a` and `θ + 2a` clamp to the same θ, θ, 1",
    "ops16": "equivalent: `_grad_factor` runs under `@torch.no_grad()` and only reads `w`",
    "sel18": "equivalent in results: the window stays `(lo, hi]` with the answer inside (only wider), so the next pass still finds it; at most one extra pass",
    "sel19": "equivalent in results: as sel18, on the other side",
    "sel22": 'equivalent in results: the first window only places the search ("affects speed only")',
    "sel23": "equivalent: every comparison casts the Python-float bound to the working dtype anyway (`torch.le(float32, 0.1)` compares with float32(0.1)), and `_split_evenly` rounds it the same way",
    "sel24": "equivalent in results: a window of exactly `cap` magnitudes is histogrammed instead of gathered, then narrowed",
    "cod19": "equivalent: `decode_nm` checks sizes and positions and raises `ValueError` itself; 20,000 fuzzed corrupt inputs gave no `IndexError`",
    "dist09": "equivalent in results: the slices of a larger mesh hold the weight alike (one copy per slice, the same values), so whichever one slice counts, each shard is counted once with the same values",
    "dist10": "equivalent in results: a shard's holders in the group are replicas of the same values; any one of them counting it (the highest instead of the lowest) counts it once",
    "fsp14": "equivalent: `_state_as_finalized` runs under `torch.no_grad()`, where the operator's output cache is not used: each `P_T(w)` is a fresh tensor that no other entry shares, and `save_sparse` only reads it before it returns (the same bytes for Feather and 2:4 models saved mid-training, with a graph alive)",
    "pr28": "equivalent: after `remove()` the parametrizations (and their threshold buffers) are out of the model and nothing writes them again (every call that would is refused), so views of the buffers keep the values copies would; `thresholds()` hands out copies anyway",
}


def load(name):
    s = importlib.util.spec_from_file_location(name, str(HERE / f"{name}.py"))
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    return m


def res(path):
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            out[r["id"]] = r
    except FileNotFoundError:
        pass
    return out


def short(by):
    if by == "timeout":
        return "timeout (the test run hangs)"
    return "`" + by.replace("tests/", "").split("[")[0] + "`"


MODULES = (
    ("ops", "`src/feather_sparse/ops.py`"),
    ("nm", "`src/feather_sparse/nm/operator.py`"),
    ("sel", "`src/feather_sparse/selection.py`"),
    ("codec", "`src/feather_sparse/export/codec.py`"),
    ("dist", "`src/feather_sparse/distributed.py`, `nm/backbone.py`"),
    ("train", "`schedules.py`, `backbones.py`, `baselines.py`, `methods.py`"),
    ("nmb", "`nm/backbone.py`, `nm/methods.py`, `nm/fused.py`"),
    ("keys", "`plain_keys.py`, `integrity.py`, `run_files.py`"),
    ("fsp", "`export/fsp.py`, `export/header.py`"),
    ("pruner", "`pruner.py`, `pruner_config.py`"),
    ("infer", "`export/inference.py`, `nm/export.py`"),
)


def main() -> None:
    tot = dict(n=0, before=0, after=0, eq=0)
    for key, title in MODULES:
        mod = load("m_" + key)
        before = res(HERE / "results" / f"results_{key}.jsonl")
        after = res(HERE / "results" / f"after_{key}.jsonl")
        own = any("tests" in m for m in mod.MUTATIONS)  # per-mutant test lists
        print(
            f"### {title}\n\nTests run"
            + (f" (each mutant its own few, listed in `m_{key}.py`; from)" if own else "")
            + ": "
            + ", ".join(f"`{t.replace('tests/', '')}`" for t in mod.TESTS)
            + ".\n"
        )
        print("| id | mutation | location | before | after (test added) |\n|---|---|---|---|---|")
        n = kb = ka = eq = 0
        for m in mod.MUTATIONS:
            r = before[m["id"]]
            n += 1
            desc = m["desc"].replace("|", "\\|").replace("*", "·")
            if r["status"] == "killed":
                kb += 1
                ka += 1
                b = "killed by " + short(r["by"])
                a = "—"
            else:
                b = "survived"
                if m["id"] in EQUIV:
                    eq += 1
                    a = EQUIV[m["id"]]
                else:
                    ar = after.get(m["id"])
                    if ar and ar["status"] == "killed":
                        ka += 1
                        a = "killed by " + short(ar["by"])
                    else:
                        a = "**survived**" if ar else "(not rerun)"
            print(f"| {m['id']} | {desc} | {LOC[m['id']]} | {b} | {a} |")
        print(
            f"\nKilled before: {kb}/{n} ({100 * kb / n:.0f} %), {kb}/{n - eq} of the non-equivalent ({100 * kb / (n - eq):.0f} %). "
            f"After: {ka}/{n - eq} of the non-equivalent ({100 * ka / (n - eq):.0f} %); {eq} judged equivalent.\n"
        )
        tot["n"] += n
        tot["before"] += kb
        tot["after"] += ka
        tot["eq"] += eq
    print(tot)


if __name__ == "__main__":
    main()
