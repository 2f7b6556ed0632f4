"""VC-Attention Capture: the chosen blocks/steps land in a capture file the loader reads; outputs unchanged."""
import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")


def test_capture_writes_the_chosen_entries_and_leaves_the_output_unchanged(tmp_path):
    import folder_paths
    from comfy.samplers import sample, simple_scheduler
    from safetensors import safe_open
    from toy_dit import toy_inputs, toy_model
    from vc_attention.study.videodata import load_captured_qkv
    from vc_attention.nodes.node_capture import VCAttentionCapture

    folder_paths.output_directory = str(tmp_path)
    model = toy_model(layout="heads")
    patched = VCAttentionCapture.execute(model, blocks="1", steps="0, 2", branches="both",
                                         filename_prefix="vc_attention/test").result[0]
    x, context = toy_inputs()
    sigmas = simple_scheduler(model.model.model_sampling, 3)
    plain = sample(model, x, sigmas, context)
    captured = sample(patched, x, sigmas, context)
    assert torch.equal(plain, captured)

    (path,) = (tmp_path / "vc_attention").glob("test_*.safetensors")
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "vc_attention_capture", "version": "1"}
        names = set(f.keys())
    entries = {f"block1_step{s}_{b}" for s in (0, 2) for b in ("cond", "uncond")}
    assert names == {f"{e}.{p}" for e in entries for p in "qkv"}
    q, k, v = load_captured_qkv(str(path), "block1_step2_uncond")
    assert q.shape == (1, 2, x.shape[1], 64) and q.dtype == torch.bfloat16 and q.is_contiguous()
    assert not torch.equal(q, k)


@pytest.mark.parametrize("field, value, words", [("blocks", "0, x", "numbers and ranges"),
                                                 ("filename_prefix", "../escape", "inside the output folder")])
def test_bad_inputs_raise_sentences(tmp_path, field, value, words):
    import folder_paths
    from toy_dit import toy_model
    from vc_attention.nodes.node_capture import VCAttentionCapture

    folder_paths.output_directory = str(tmp_path)
    inputs = dict(blocks="0", steps="0", branches="cond", filename_prefix="vc_attention/capture") | {field: value}
    with pytest.raises(ValueError, match=words):
        VCAttentionCapture.execute(toy_model(), **inputs)


def test_index_lists_parse_ranges():
    from vc_attention.nodes.node_capture import parse_index_list

    assert parse_index_list("0, 10-12,3", "blocks") == {0, 3, 10, 11, 12}


@pytest.mark.parametrize("prefix", ["", ".", "./", "vc_attention/", "sub/.."])
def test_a_prefix_without_a_file_name_is_refused(tmp_path, prefix):
    """'' or '.' once wrote output_00001.safetensors beside the output folder, not in it."""
    from vc_attention.nodes.node_capture import next_free_path

    out = tmp_path / "output"
    out.mkdir()
    with pytest.raises(ValueError, match="filename_prefix"):
        next_free_path(out, prefix)
    assert list(tmp_path.iterdir()) == [out]


def test_a_symlink_out_of_the_output_folder_is_not_followed(tmp_path):
    from vc_attention.nodes.node_capture import next_free_path

    out, elsewhere = tmp_path / "output", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "link").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="inside the output folder"):
        next_free_path(out, "link/capture")
    (out / "capture_00001.safetensors").symlink_to(elsewhere / "planted.safetensors")  # a dangling file link
    assert next_free_path(out, "capture").name == "capture_00002.safetensors"
    assert next_free_path(out, "sub/capture") == out.resolve() / "sub" / "capture_00001.safetensors"


@pytest.mark.parametrize("text, words", [("0-1000000000", "at most 9999"), ("12-10", "12-10"),
                                         ("100000", "at most 9999")])
def test_index_lists_are_bounded(text, words):
    """An unbounded range ('0-1000000000') once ran the server out of memory while parsing."""
    from vc_attention.nodes.node_capture import parse_index_list

    with pytest.raises(ValueError, match=words):
        parse_index_list(text, "steps")
