"""What a command prints instead of a traceback: one sentence naming the problem and its remedy.

`cli.main` prints a CommandError (and the library's ValueError / JitError, which are written the
same way) on one line and exits with status 2.
"""
from __future__ import annotations

EXIT_USAGE = 2


class CommandError(Exception):
    """A command cannot run here; the message says why and what to do about it."""


def cuda_unavailable_remedy() -> str | None:
    """Why no CUDA GPU can be used in this process, with the fix, or None when one can."""
    import torch

    if torch.version.cuda is None:
        return (f"this PyTorch ({torch.__version__}) is built without CUDA: install a CUDA build of PyTorch "
                "(https://pytorch.org/get-started/locally/) on a machine with an NVIDIA GPU")
    if not torch.cuda.is_available():
        return ("PyTorch sees no CUDA GPU: check that `nvidia-smi` lists one and that CUDA_VISIBLE_DEVICES "
                "does not hide it")
    return None


def require_cuda(what: str) -> None:
    """Raise CommandError if `what` (e.g. "vc-attention bench") cannot use a CUDA GPU here."""
    remedy = cuda_unavailable_remedy()
    if remedy:
        raise CommandError(f"{what} needs a CUDA GPU, but {remedy}. `vc-attention doctor` lists what this machine offers.")
