"""Stand-in of the sampling path: simple scheduler, CFG batching, k-diffusion evaluation patterns.

As in ComfyUI, a run is model_patcher.pre_run() ... model_patcher.cleanup(); each model evaluation
builds a transformer_options dict from model_options["transformer_options"] with cond_or_uncond,
uuids, sigmas and sample_sigmas and calls BaseModel.apply_model once per batch (cond and uncond
together, or one forward each when `batch_cfg` is False, as ComfyUI does when memory is short).
"""
import math

import torch

COND, UNCOND = 0, 1


def simple_scheduler(model_sampling, steps):
    s = model_sampling
    sigs = []
    ss = len(s.sigmas) / steps
    for x in range(steps):
        sigs += [float(s.sigmas[-(1 + int(x * ss))])]
    sigs += [0.0]
    return torch.FloatTensor(sigs)


def _forward(model_patcher, x, sigma, cond_or_uncond, context, sample_sigmas):
    transformer_options = dict(model_patcher.model_options["transformer_options"])
    transformer_options["cond_or_uncond"] = list(cond_or_uncond)
    transformer_options["uuids"] = [f"uuid-{c}" for c in cond_or_uncond]
    transformer_options["sigmas"] = sigma.reshape(1)
    transformer_options["sample_sigmas"] = sample_sigmas
    batch = torch.cat([x] * len(cond_or_uncond))
    ctx = torch.cat([context[c] for c in cond_or_uncond])
    out = model_patcher.model.apply_model(batch, sigma, context=ctx, transformer_options=transformer_options)
    return out.chunk(len(cond_or_uncond))


@torch.inference_mode()  # ComfyUI's executor runs every prompt under inference mode: no autograd
def cfg_denoise(model_patcher, x, sigma, context, cfg, sample_sigmas, batch_cfg=True):
    """Denoised prediction with CFG; context = {COND: tensor, UNCOND: tensor}."""
    if batch_cfg:
        cond, uncond = _forward(model_patcher, x, sigma, [COND, UNCOND], context, sample_sigmas)
    else:
        (cond,) = _forward(model_patcher, x, sigma, [COND], context, sample_sigmas)
        (uncond,) = _forward(model_patcher, x, sigma, [UNCOND], context, sample_sigmas)
    eps = uncond + cfg * (cond - uncond)
    return x - sigma * eps


def _evaluation_sigmas(sampler, sigmas):
    """The sigmas at which k-diffusion's sampler evaluates the model, in order."""
    out = []
    for i in range(len(sigmas) - 1):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        out.append(s)
        if s_next == 0:
            continue
        if sampler == "heun":
            out.append(s_next)
        elif sampler == "dpmpp_sde":  # second evaluation at the log-midpoint (r = 1/2)
            t, t_next = -math.log(s), -math.log(s_next)
            out.append(math.exp(-(t + 0.5 * (t_next - t))))
        elif sampler != "euler":
            raise ValueError(f"stand-in sampler {sampler!r} not implemented")
    return out


@torch.inference_mode()
def sample(model_patcher, x, sigmas, context, sampler="euler", cfg=5.0, batch_cfg=True):
    """One sampling run (KSampler / KSamplerAdvanced with the given sigmas slice)."""
    model_patcher.pre_run()
    try:
        evaluations = _evaluation_sigmas(sampler, sigmas)
        for j, s in enumerate(evaluations):
            sigma = torch.tensor(s)
            denoised = cfg_denoise(model_patcher, x, sigma, context, cfg, sigmas, batch_cfg)
            s_next = evaluations[j + 1] if j + 1 < len(evaluations) else 0.0
            x = denoised + (x - denoised) * (s_next / s)  # an euler step between evaluations
        return x
    finally:
        model_patcher.cleanup()
