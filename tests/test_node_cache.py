"""The per-layer grouping cache: keys, reuse after the window, compact storage, memory, reset."""
import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")


def start(model, clusters=16, **settings):
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes.override import make_override
    from vc_attention.nodes.patch import Settings, VCPatch

    patch = VCPatch(Settings(config=FIDELITY, clusters=clusters, kmeans_iters=2, grouping_window=0.25,
                             start_percent=0.0, end_percent=1.0, backend="reference", **settings))
    model.model_options["transformer_options"]["optimized_attention_override"] = make_override(patch.attend, None)
    patch.start_run(model)
    return patch


def evaluate(model, sigma, batch_cfg=True):
    from comfy.samplers import cfg_denoise
    from toy_dit import toy_inputs

    x, context = toy_inputs()
    cfg_denoise(model, x, torch.tensor(sigma), context, 5.0, None, batch_cfg=batch_cfg)


def test_inside_the_window_regroup_with_warm_start_after_it_reuse():
    from toy_dit import toy_model

    model = toy_model()
    patch = start(model)
    evaluate(model, 0.99)  # inside the first 25%
    first = {k: g.labels.clone() for k, g in patch.cache._entries.items()}
    assert patch.stats.grouping_calls == 2 and all(g.has_centroids for g in patch.cache._entries.values())
    # the cache keeps them compact: E4M3 codes and one float32 scale per centroid
    assert all(g.centroids.dtype == torch.float8_e4m3fn and g.centroid_scale.shape == (*g.counts.shape, 1)
               for g in patch.cache._entries.values())
    evaluate(model, 0.98)
    assert patch.stats.grouping_calls == 4
    evaluate(model, 0.3)  # past the window: reuse, and the centroids are freed
    evaluate(model, 0.2)
    assert patch.stats.grouping_calls == 4
    assert not any(g.has_centroids or g.centroid_scale is not None for g in patch.cache._entries.values())
    assert set(first) == set(patch.cache._entries)
    keys = sorted(patch.cache._entries)
    assert keys == [(("double", 0), 0, (0, 1), 100, 2), (("double", 1), 0, (0, 1), 100, 2)]
    assert all(g.labels.dtype == torch.uint8 for g in patch.cache._entries.values())
    patch.end_run()
    assert len(patch.cache) == 0


def test_models_without_block_index_are_keyed_by_call_order_and_branches_separately():
    from toy_dit import toy_model

    model = toy_model(report_block_index=False)
    patch = start(model)
    evaluate(model, 0.99, batch_cfg=False)
    evaluate(model, 0.98, batch_cfg=False)
    keys = sorted(patch.cache._entries)
    assert keys == [(("call", i), 0, (branch,), 100, 1) for i in (0, 1) for branch in (0, 1)]
    assert patch.stats.grouping_calls == 8


def test_cache_bytes_match_the_stated_formula():
    from toy_dit import toy_model
    from vc_attention.nodes.cache import estimated_bytes

    model = toy_model()
    patch = start(model, clusters=16)
    evaluate(model, 0.99)
    shape = dict(blocks=2, branches=2, heads=2, tokens=100, head_dim=64, clusters=16)
    assert patch.cache.nbytes == estimated_bytes(**shape, with_centroids=True)
    evaluate(model, 0.2)
    assert patch.cache.nbytes == estimated_bytes(**shape, with_centroids=False)


def test_wan22_14b_720p_with_cfg_stays_under_300_mb_with_every_preset():
    from vc_attention.nodes import presets
    from vc_attention.nodes.cache import WAN22_14B_720P_CFG, estimated_bytes

    for mode, values in presets.PRESETS.items():
        total = estimated_bytes(**WAN22_14B_720P_CFG, clusters=values["clusters"], with_centroids=True)
        assert total <= 300e6, (mode, total)
    # the figures the docs quote (nodes/cache.py)
    assert round(estimated_bytes(**WAN22_14B_720P_CFG, clusters=64, with_centroids=True) / 1e6) == 270
    assert round(estimated_bytes(**WAN22_14B_720P_CFG, clusters=128, with_centroids=True) / 1e6) == 298
    assert round(estimated_bytes(**WAN22_14B_720P_CFG, clusters=64, with_centroids=False) / 1e6) == 243


def test_changing_cfg_batching_within_a_run_replaces_entries_instead_of_doubling_them():
    """cond+uncond in one batch, then one forward each (ComfyUI does so when memory is short): the
    per-branch entries replace the batched one for the same layer, counted as evictions."""
    from toy_dit import toy_model

    model = toy_model()
    patch = start(model)
    evaluate(model, 0.99, batch_cfg=True)
    assert len(patch.cache) == 2
    evaluate(model, 0.98, batch_cfg=False)
    assert len(patch.cache) == 4 and patch.stats.cache_evictions == 2  # (0, 1) -> (0,) and (1,) per block
    evaluate(model, 0.97, batch_cfg=True)
    assert len(patch.cache) == 2 and patch.stats.cache_evictions == 6
    assert sorted(k[2] for k in patch.cache._entries) == [(0, 1), (0, 1)]
    assert patch.stats.payload("1")["cache_evictions"] == 6


def test_a_resolution_change_replaces_the_layer_entry():
    from vc_attention.kernels.grouping import group_tokens
    from vc_attention.nodes.cache import GroupingCache, LayerKey

    cache = GroupingCache()
    small, large = (group_tokens(torch.randn(1, 2, n, 64), 4, 1) for n in (100, 200))
    assert cache.put(LayerKey(("double", 0), 0, (0,), 100, 1), small) == 0
    assert cache.put(LayerKey(("double", 1), 0, (0,), 100, 1), small) == 0  # another layer: kept
    assert cache.put(LayerKey(("double", 0), 0, (0,), 200, 1), large) == 1
    assert len(cache) == 2 and cache.get(LayerKey(("double", 0), 0, (0,), 100, 1)) is None


def test_within_cluster_bins_keep_the_centroids_and_rebin_each_reuse_from_its_own_v(monkeypatch):
    from toy_dit import toy_model
    from vc_attention.kernels import grouping, grouping_within

    model = toy_model()
    patch = start(model, within_bins=4)
    seen = []
    original = grouping.CompactGrouping.perm

    def recording_perm(self, v_bhnd=None):
        perm = original(self, v_bhnd)
        seen.append((self, v_bhnd, perm))
        return perm

    monkeypatch.setattr(grouping.CompactGrouping, "perm", recording_perm)
    evaluate(model, 0.99)
    assert patch.stats.grouping_calls == 2 and all(g.within_bins == 4 for g, _, _ in seen)
    evaluate(model, 0.2)  # past the window: the centroids stay (the bins need them), the bins follow this V
    assert patch.stats.grouping_calls == 2
    assert all(g.has_centroids for g in patch.cache._entries.values())
    reused = seen[2:]
    assert len(reused) == 2
    for g, v, perm in reused:
        assert v is not None
        assert torch.equal(perm, grouping_within.within_perm(v, g.labels, g.counts, g.warm_centroids(), 4))


def test_each_mode_takes_its_presets_within_bins_and_custom_the_groupings_default(monkeypatch):
    from vc_attention.kernels.grouping import DEFAULT_WITHIN_BINS
    from vc_attention.nodes import presets
    from vc_attention.nodes.node_attention import settings_from_widgets

    widgets = {name: spec["default"] for name, spec in presets.WIDGETS.items() if name != "mode"}
    monkeypatch.setitem(presets.WITHIN_BINS, "fidelity", 8)
    assert settings_from_widgets(presets.resolve("fidelity", widgets), "fidelity").within_bins == 8
    assert settings_from_widgets(presets.resolve("speed", widgets), "speed").within_bins == presets.WITHIN_BINS["speed"]
    assert settings_from_widgets(presets.resolve("custom", widgets), "custom").within_bins == DEFAULT_WITHIN_BINS
