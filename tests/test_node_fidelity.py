"""VC-Attention Fidelity Check: PSNR/SSIM per frame and mean, outputs and the text on the node."""
import math

import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")


def frames(seed=0, n=3, h=24, w=32):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, h, w, 3, generator=g)


def test_psnr_is_exact_for_a_known_error():
    from vc_attention.nodes.image_metrics import psnr_per_frame

    a = torch.full((2, 16, 16, 3), 0.5)
    b = a.clone()
    b[1] += 0.1  # MSE 0.01 -> 20 dB
    psnr = psnr_per_frame(a, b)
    assert psnr[0] == math.inf and psnr[1] == pytest.approx(20.0, abs=1e-5)  # 0.6 - 0.5 in float32


def test_ssim_is_one_for_identical_frames_and_matches_an_independent_implementation():
    scipy_ndimage = pytest.importorskip("scipy.ndimage")
    from vc_attention.nodes.image_metrics import SSIM_C1, SSIM_C2, ssim_per_frame

    a, noise = frames(), frames(seed=1)
    b = (a + 0.1 * (noise - 0.5)).clamp(0, 1)
    assert ssim_per_frame(a, a) == pytest.approx([1.0] * 3, abs=1e-12)

    def scipy_ssim(x, y):  # Gaussian filter (sigma 1.5, radius 5 = 11 taps), border of 5 cropped
        x, y = x.double().numpy(), y.double().numpy()
        blur = lambda t: scipy_ndimage.gaussian_filter(t, sigma=1.5, truncate=3.5)
        values = []
        for c in range(3):
            xc, yc = x[..., c], y[..., c]
            mx, my = blur(xc), blur(yc)
            vx, vy, cov = blur(xc * xc) - mx**2, blur(yc * yc) - my**2, blur(xc * yc) - mx * my
            s = ((2 * mx * my + SSIM_C1) * (2 * cov + SSIM_C2)) / ((mx**2 + my**2 + SSIM_C1) * (vx + vy + SSIM_C2))
            values.append(s[5:-5, 5:-5])
        return sum(v.mean() for v in values) / 3

    expected = [scipy_ssim(a[i], b[i]) for i in range(3)]
    got = ssim_per_frame(a, b)
    assert got == pytest.approx(expected, abs=1e-9)
    assert all(0.9 < s < 0.999 for s in got)


def test_the_node_returns_means_and_shows_the_per_frame_report():
    from vc_attention.nodes.image_metrics import psnr_per_frame, ssim_per_frame
    from vc_attention.nodes.node_fidelity import VCAttentionFidelityCheck

    a, b = frames(), frames(seed=2)
    out = VCAttentionFidelityCheck.execute(reference=a, test=b)
    psnr_mean, ssim_mean, text = out.result
    assert psnr_mean == pytest.approx(sum(psnr_per_frame(a, b)) / 3)
    assert ssim_mean == pytest.approx(sum(ssim_per_frame(a, b)) / 3)
    assert out.ui.as_dict() == {"text": (text,)}
    assert text.count("frame ") == 3 and "mean" in text and "(3 frames)" in text


def test_mismatched_batches_raise_a_sentence():
    from vc_attention.nodes.node_fidelity import VCAttentionFidelityCheck

    with pytest.raises(ValueError, match="differ in shape"):
        VCAttentionFidelityCheck.execute(reference=frames(n=3), test=frames(n=2))
