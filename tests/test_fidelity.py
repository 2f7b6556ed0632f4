"""Fidelity metrics, the method table and the `vc-attention fidelity` command."""
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from vc_attention import cli
from vc_attention.kernels import FIDELITY, PLAIN_8BIT
from vc_attention.kernels import reference as ref
from vc_attention.study import fidelity as fi
from vc_attention.study import videodata as vd


def test_output_metrics_on_a_known_error():
    exact = torch.tensor([3.0, -4.0, 0.0, 0.0], dtype=torch.float64)
    err = torch.tensor([0.0, 0.0, 0.5, -0.5], dtype=torch.float64)
    m = fi.output_metrics(exact + err, exact)
    assert m["rel_l2"] == pytest.approx(math.sqrt(0.5) / 5)
    assert m["max_abs"] == pytest.approx(0.5)
    assert m["psnr_db"] == pytest.approx(20 * math.log10(4.0 / math.sqrt(0.5 / 4)))  # peak = max|exact|
    assert m["cosine"] == pytest.approx(25 / (5 * math.sqrt(25.5)))
    assert fi.output_metrics(exact, exact)["psnr_db"] == math.inf


def test_error_split_shares():
    exact = torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    exact[..., 0] = 1.0
    qk_err = torch.tensor([0.0, 0.3], dtype=torch.float64)
    v_err = torch.tensor([0.4, 0.0], dtype=torch.float64)
    parts = ref.ReferenceParts(exact + qk_err + v_err, exact + qk_err, torch.zeros(1, 1, 2))
    split = fi.error_split(parts, exact)
    norm = math.sqrt(2.0)
    assert split["qk_term"] == pytest.approx(math.sqrt(2 * 0.09) / norm)
    assert split["v_term"] == pytest.approx(math.sqrt(2 * 0.16) / norm)
    assert split["v_share"] == pytest.approx(0.16 / 0.25)


def test_block_mean_energy_removal():
    # two interleaved constant groups: block means remove nothing in token order, everything sorted
    n = 256
    labels = torch.arange(n) % 2
    v = torch.where(labels.view(1, 1, n, 1) == 0, 1.0, -1.0).expand(1, 1, n, 8).double()
    assert fi.block_mean_energy_removal(v) == pytest.approx(0.0, abs=1e-12)
    perm = ref.labels_to_permutation(labels.view(1, 1, n))
    assert fi.block_mean_energy_removal(v, perm) == pytest.approx(1.0)
    # a tail block of one row: its mean is the row itself, so that row's energy is removed exactly
    tail = torch.cat([torch.tensor([1.0, -1.0]).repeat(64), torch.tensor([5.0])]).view(1, 1, 129, 1)
    assert fi.block_mean_energy_removal(tail) == pytest.approx(25 / (128 + 25))


@pytest.fixture(scope="module")
def small_table():
    q, k, v = vd.video_like_qkv(T=1, Hgrid=16, Wgrid=32, seed=0)
    return {r.method: r for r in fi.fidelity_table(q, k, v, clusters=8, iters=4)}


def test_table_has_every_method_with_sane_ordering(small_table):
    assert list(small_table) == list(fi.METHODS)
    bf16 = small_table["BF16 (inputs rounded)"]
    sa2 = small_table["SageAttention2-style 8-bit"]
    sa3 = small_table["SageAttention3-style 4-bit"]
    assert bf16.rel_l2 < sa2.rel_l2 < sa3.rel_l2
    for row in small_table.values():
        assert 0 < row.rel_l2 < 0.2 and row.cosine > 0.98 and 0 <= row.v_share <= 1
        # QK and V terms add up to the total error vector, so the total lies between |a-b| and a+b
        assert abs(row.qk_term - row.v_term) - 1e-12 <= row.rel_l2 <= row.qk_term + row.v_term + 1e-12


def test_vsmooth_lowers_the_v_term_on_video_like_data(small_table):
    sa2 = small_table["SageAttention2-style 8-bit"]
    assert small_table["V-Smooth 8-bit"].v_term < 0.95 * sa2.v_term
    assert small_table["V-Smooth 4-bit"].v_term < 0.95 * small_table["SageAttention3-style 4-bit"].v_term
    # the QK term does not depend on how V is quantized: with the same key order, P is the same
    # (across key orders it is not: K block scales and the running max's history follow the order)
    q, k, v = vd.video_like_qkv(T=1, Hgrid=16, Wgrid=32, seed=0)
    perm = fi.grouping_permutation(v, 8, 4)
    # (FIDELITY with PLAIN_8BIT's P encoding and K scales per 128 keys: only V's quantization differs between the two)
    vsmooth = ref.vc_attention_reference(q, k, v, FIDELITY.with_(k_scale_rows=PLAIN_8BIT.k_scale_rows, p=PLAIN_8BIT.p),
                                         perm=perm, parts=True)
    per_channel = ref.vc_attention_reference(q, k, v, PLAIN_8BIT, perm=perm, parts=True)
    assert torch.equal(vsmooth.out_exact_v, per_channel.out_exact_v)
    assert not torch.equal(vsmooth.out, per_channel.out)


def test_unknown_method_raises():
    q = torch.zeros(1, 1, 4, 64)
    with pytest.raises(ValueError, match="unknown methods"):
        fi.fidelity_table(q, q, q, clusters=2, iters=1, methods=("FP2",))


TINY = ["--frames", "1", "--height", "4", "--width", "8", "--clusters", "2", "--iters", "2"]


def test_cli_table(capsys):
    assert cli.main(["fidelity", *TINY]) == 0
    out = capsys.readouterr().out
    assert "synthetic, calibrated data" in out
    assert "| method | rel-L2 | PSNR (dB) |" in out
    for method in fi.METHODS:
        assert f"| {method} |" in out


def test_cli_json_on_captured_file(tmp_path, capsys):
    q, k, v = (t.to(torch.bfloat16).contiguous() for t in vd.video_like_qkv(H=3, T=1, Hgrid=4, Wgrid=8, seed=1))
    path = tmp_path / "cap.safetensors"
    save_file({"b0.q": q, "b0.k": k, "b0.v": v}, str(path), metadata={"format": "vc_attention_capture", "version": "1"})
    assert cli.main(["fidelity", "--qkv", str(path), "--entry", "b0", "--heads", "2", "--json", "--clusters", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["shape"] == [1, 2, 32, 128] and result["dtype"] == "bfloat16"
    assert [r["method"] for r in result["rows"]] == list(fi.METHODS)
    # bf16 inputs are already rounded: the BF16 row is exact up to float64 summation order
    assert result["rows"][0]["rel_l2"] < 1e-12


def test_cli_rejects_a_file_that_is_not_a_capture(tmp_path, capsys):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"nothing")
    assert cli.main(["fidelity", "--qkv", str(path)]) == 2
    assert "not a readable safetensors file" in capsys.readouterr().err


def test_cli_calibration_with_knobs(capsys):
    knobs = ["--knob", "regions=4", "--knob", "pos_strength=9"]
    assert cli.main(["fidelity", *TINY, "--calibration", "--json", *knobs]) == 0
    stats = json.loads(capsys.readouterr().out)["calibration"]
    assert set(stats) == {"removal_token_order", "removal_kmeans_order", "v_share", "effective_keys"}
    assert 0 <= stats["removal_token_order"] <= 1 and stats["effective_keys"] >= 1
    assert cli.main(["fidelity", *TINY, "--calibration", "--removal-only", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["calibration"]) == {"removal_token_order", "removal_kmeans_order"}
    assert cli.main(["fidelity", *TINY, "--knob", "regions"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_table_on_cuda_matches_cpu():
    q, k, v = vd.video_like_qkv(T=1, Hgrid=8, Wgrid=24, seed=2)
    cpu = fi.fidelity_table(q, k, v, clusters=2, iters=2)
    gpu = fi.fidelity_table(q.cuda(), k.cuda(), v.cuda(), clusters=2, iters=2)
    for c, g in zip(cpu, gpu):
        # same quantizers; float32 sums in another order can flip a rounding, hence not bit-exact
        assert g.method == c.method and g.rel_l2 == pytest.approx(c.rel_l2, rel=0.05)


@pytest.mark.parametrize("option, value", [("--clusters", "-5"), ("--clusters", "0"), ("--iters", "0"),
                                           ("--iters", "-1"), ("--clusters", "many")])
def test_cli_refuses_counts_below_one_in_one_sentence(capsys, option, value):
    """--clusters -5 ran 251 clusters while reporting -5; 0 was replaced by the default silently."""
    args = [a for a in TINY if a not in ("--clusters", "--iters", "2")] + [option, value]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fidelity", *args])
    assert exit_info.value.code == 2
    assert f"argument {option}: must be a whole number of at least 1, got {value!r}" in capsys.readouterr().err
