"""Study code: what measures and explores the kernels, never what runs in a user's graph.

The video-like data generator and capture loader (videodata), fidelity metrics and tables
(fidelity), ExpCast encoding variants (expcast_variants) and the 4-bit emulation (reference_fp4).
The CLI (`vc-attention fidelity`, `demo`), the bench scripts and the tests import it; the nodes
and kernels/ never do.
"""
