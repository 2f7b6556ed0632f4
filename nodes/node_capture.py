"""The "VC-Attention Capture" node: save Q/K/V of chosen blocks and steps for offline fidelity runs.

Output file (read by study.videodata.load_captured_qkv and `vc-attention fidelity --qkv FILE`):
safetensors in ComfyUI's output folder, tensors "<entry>.q", "<entry>.k", "<entry>.v", each
(B, H, N, D) contiguous fp16/bf16 (fp32 models are stored as bf16), entry =
"block{index}_step{n}_{cond|uncond}", metadata {"format": "vc_attention_capture", "version": "1"}.
step n is the n-th distinct noise level of the run (the sampler step for one-evaluation samplers
such as euler; a heun step's second evaluation belongs to the next level). The first self-attention
call of a block at a step is kept. Nothing is changed in the model's computation.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Optional

import torch
from comfy_api.latest import io

from ..kernels.layout import to_bhnd
from . import override as O
from .capture_format import CAPTURE_FORMAT, CAPTURE_VERSION
from .node_attention import CATEGORY
from .patch import CALLBACK_KEY, install_handler

NODE_ID = "VCAttentionCapture"
FORMAT_METADATA = {"format": CAPTURE_FORMAT, "version": CAPTURE_VERSION}  # what the loader checks
BRANCH_NAMES = {0: "cond", 1: "uncond"}  # ComfyUI's COND / UNCOND indices in cond_or_uncond


# No model has this many blocks or sampler steps; the cap keeps a typo such as "0-1000000000" from
# expanding into a billion-element set in memory.
MAX_INDEX = 9999


def parse_index_list(text: str, what: str) -> set[int]:
    """'0, 10-12' -> {0, 10, 11, 12}; anything else is a readable error."""
    if not re.fullmatch(r"\s*(\d+\s*(-\s*\d+\s*)?)(,\s*\d+\s*(-\s*\d+\s*)?)*,?\s*", text or ""):
        raise ValueError(f"VC-Attention Capture: {what} must be numbers and ranges like '0, 10-12', got {text!r}.")
    chosen: set[int] = set()
    for part in text.split(","):
        if part.strip():
            lo_text, _, hi_text = part.partition("-")
            lo, hi = int(lo_text), int(hi_text or lo_text)
            if hi > MAX_INDEX:
                raise ValueError(f"VC-Attention Capture: {what} indices must be at most {MAX_INDEX}, got {part.strip()!r}.")
            if lo > hi:
                raise ValueError(f"VC-Attention Capture: the {what} range {part.strip()!r} is empty; write it low-high.")
            chosen.update(range(lo, hi + 1))
    return chosen


def next_free_path(folder: Path, prefix: str) -> Path:
    """The first unused "<prefix>_NNNNN.safetensors" inside `folder`, whose directories are created.

    The prefix must name a file (not "", "." or a trailing "/") and, with every symlink resolved,
    stay inside the resolved output folder: a link inside it must not lead the file out of it.
    """
    outside = f"VC-Attention Capture: filename_prefix must stay inside the output folder, got {prefix!r}."
    if Path(prefix).is_absolute() or ".." in Path(prefix).parts:
        raise ValueError(outside)
    if not prefix.strip() or prefix.endswith(("/", "\\")) or Path(prefix).name in ("", "."):
        raise ValueError(f"VC-Attention Capture: filename_prefix must end in a file name, like 'vc_attention/capture', got {prefix!r}.")
    root = folder.resolve()
    base = root / prefix
    if not base.parent.resolve().is_relative_to(root):  # checked before mkdir creates anything
        raise ValueError(outside)
    base.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while os.path.lexists(path := base.parent / f"{base.name}_{n:05d}.safetensors"):
        n += 1  # lexists: a link named like our file, even a dangling one, is never written through
    return path


class QKVRecorder:
    def __init__(self, blocks: set[int], steps: set[int], branches: set[int], output_dir: Path, prefix: str):
        self.blocks, self.steps, self.branches = blocks, steps, branches
        self.output_dir, self.prefix = output_dir, prefix
        self.written: list[Path] = []
        self.start_run()

    def start_run(self, model_patcher=None) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._levels: list[float] = []
        self._forward_options: Optional[dict] = None
        self._calls_in_forward = 0

    def end_run(self, model_patcher=None) -> None:
        if self.tensors:
            from safetensors.torch import save_file

            path = next_free_path(self.output_dir, self.prefix)
            save_file(self.tensors, str(path), metadata=FORMAT_METADATA)
            self.written.append(path)
            logging.info(f"VC-Attention Capture: wrote {len(self.tensors) // 3} entries to {path}")
        self.start_run()

    def _step_and_block(self, transformer_options: dict) -> tuple[Optional[int], int]:
        if transformer_options is not self._forward_options:
            self._forward_options = transformer_options
            self._calls_in_forward = 0
        index = transformer_options.get("block_index")
        if index is None:
            index = self._calls_in_forward
        self._calls_in_forward += 1
        sigmas = transformer_options.get("sigmas")
        if sigmas is None:
            return None, index
        sigma = float(torch.as_tensor(sigmas).reshape(-1)[0])
        if sigma not in self._levels:
            self._levels.append(sigma)
        return self._levels.index(sigma), index

    def observe(self, call: O.AttentionCall) -> torch.Tensor:
        reason = O.ineligible(call.q, call.k, call.v, call.heads, call.mask, call.skip_reshape, call.kwargs)
        if reason is None or reason[0] in (O.DTYPE, O.AUTOGRAD):  # fp32 tensors too: stored as bf16
            self._record(call.q, call.k, call.v, call.heads, call.skip_reshape,
                         call.kwargs.get("transformer_options") or {})
        return call.model_attention()

    def _record(self, q, k, v, heads, skip_reshape, transformer_options: dict) -> None:
        step, block = self._step_and_block(transformer_options)
        if step not in self.steps or block not in self.blocks:
            return
        branches = list(transformer_options.get("cond_or_uncond") or [0])
        per_branch = q.shape[0] // len(branches)
        for i, branch in enumerate(branches):
            entry = f"block{block}_step{step}_{BRANCH_NAMES.get(branch, branch)}"
            if branch not in self.branches or f"{entry}.q" in self.tensors:
                continue
            for name, t in (("q", q), ("k", k), ("v", v)):
                bhnd, layout = O.to_kernel_layout(t[i * per_branch : (i + 1) * per_branch], heads, skip_reshape)
                bhnd = to_bhnd(bhnd, layout)
                dtype = t.dtype if t.dtype in O.SUPPORTED_DTYPES else torch.bfloat16
                self.tensors[f"{entry}.{name}"] = bhnd.detach().to(device="cpu", dtype=dtype).contiguous()


class VCAttentionCapture(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=NODE_ID,
            display_name="VC-Attention Capture",
            category=CATEGORY,
            description="Saves the Q, K and V of chosen self-attention blocks and steps to a safetensors file in "
            "ComfyUI's output folder when sampling ends, for `vc-attention fidelity --qkv FILE`. The model's "
            "output is unchanged. One Wan2.2-14B 720p entry is about 2.3 GB: choose few blocks and steps.",
            inputs=[
                io.Model.Input("model", tooltip="The model whose attention inputs to record (a patched copy is returned)."),
                io.String.Input("blocks", default="0, 20", tooltip="Transformer block indices to record, e.g. '0, 10-12'."),
                io.String.Input("steps", default="0, 10", tooltip="Steps to record (0 = first noise level), e.g. '0, 5-6'."),
                io.Combo.Input("branches", options=["cond", "uncond", "both"], default="cond",
                               tooltip="Record the positive (cond) branch, the negative (uncond) one, or both."),
                io.String.Input("filename_prefix", default="vc_attention/capture",
                                tooltip="File name prefix inside ComfyUI's output folder; a counter and .safetensors are appended."),
            ],
            outputs=[io.Model.Output(display_name="model", tooltip="A patched copy of the model that records its attention inputs (the input model is left unchanged).")],
        )

    @classmethod
    def execute(cls, model, blocks, steps, branches, filename_prefix) -> io.NodeOutput:
        import folder_paths  # ComfyUI's module: where the output folder is

        chosen_branches = {"cond": {0}, "uncond": {1}, "both": {0, 1}}[branches]
        output_dir = Path(folder_paths.get_output_directory())
        next_free_path(output_dir, filename_prefix)  # validate the prefix now, not after sampling
        recorder = QKVRecorder(parse_index_list(blocks, "blocks"), parse_index_list(steps, "steps"),
                               chosen_branches, output_dir, filename_prefix)
        return io.NodeOutput(install_handler(model, recorder.observe, recorder.start_run, recorder.end_run,
                                             CALLBACK_KEY + "_capture"))
