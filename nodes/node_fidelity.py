"""The "VC-Attention Fidelity Check" node: PSNR and SSIM between two IMAGE batches, per frame."""
from __future__ import annotations

from comfy_api.latest import io, ui

from .image_metrics import psnr_per_frame, ssim_per_frame
from .node_attention import CATEGORY

NODE_ID = "VCAttentionFidelityCheck"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report(psnr: list[float], ssim: list[float]) -> str:
    """Readable table: one line per frame, then the mean (inf PSNR = identical frames)."""
    lines = [f"frame {i:4d}: PSNR {p:7.2f} dB  SSIM {s:.4f}" for i, (p, s) in enumerate(zip(psnr, ssim))]
    lines.append(f"mean      : PSNR {_mean(psnr):7.2f} dB  SSIM {_mean(ssim):.4f}  ({len(psnr)} frames)")
    return "\n".join(lines)


class VCAttentionFidelityCheck(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=NODE_ID,
            display_name="VC-Attention Fidelity Check",
            category=CATEGORY,
            description="Compares two renders of the same prompt and seed (e.g. BF16 attention vs VC-Attention): "
            "PSNR and SSIM per frame and their mean, shown on the node and returned as outputs.",
            inputs=[
                io.Image.Input("reference", tooltip="Frames from the reference run (e.g. the model's own BF16 attention)."),
                io.Image.Input("test", tooltip="Frames from the run to check (e.g. with VC-Attention), same size and count."),
            ],
            outputs=[
                io.Float.Output(display_name="psnr_mean", tooltip="Mean PSNR over the frames in dB (peak 1.0)."),
                io.Float.Output(display_name="ssim_mean", tooltip="Mean SSIM over the frames (11x11 Gaussian window)."),
                io.String.Output(display_name="report", tooltip="Per-frame PSNR and SSIM as text."),
            ],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, reference, test) -> io.NodeOutput:
        psnr = psnr_per_frame(reference, test)
        ssim = ssim_per_frame(reference, test)
        text = report(psnr, ssim)
        return io.NodeOutput(_mean(psnr), _mean(ssim), text, ui=ui.PreviewText(text))
