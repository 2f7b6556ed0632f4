"""kernels/mma_v_f16.py on the CPU: the key order of the f16 V operand and its torch map (the GPU file checks the
extension's conversion against this map and the kernel's output against the via-f16 build's)."""
import pytest
import torch

from vc_attention.kernels import mma_v_f16, mma_variants


def test_key_order_is_the_via_f16_unpack_order():
    # e4m3x4_to_f16x2x2 gives thread t's f16 k-slots 2t, 2t + 1 the keys 4t, 4t + 1 and slots 2t + 8, 2t + 9 the keys
    # 4t + 2, 4t + 3 (common.cuh); ldmatrix gives thread t positions 2t, 2t + 1 of each 8-key matrix
    assert sorted(mma_v_f16.KEY_ORDER) == list(range(16))
    for t in range(4):
        for j in range(2):
            assert mma_v_f16.KEY_ORDER[2 * t + j] == 4 * t + j
            assert mma_v_f16.KEY_ORDER[8 + 2 * t + j] == 4 * t + 2 + j


def test_paired_key_order_is_the_shift_and_mask_unpack_order():
    # e4m3x4_to_f16x2x2_scaled: even = bytes 0, 2 (keys 4t, 4t + 2) to k-slots 2t, 2t + 1; odd = bytes 1, 3 to 2t + 8, 2t + 9
    assert sorted(mma_v_f16.PAIRED_KEY_ORDER) == list(range(16))
    for t in range(4):
        for j in range(2):
            assert mma_v_f16.PAIRED_KEY_ORDER[2 * t + j] == 4 * t + 2 * j
            assert mma_v_f16.PAIRED_KEY_ORDER[8 + 2 * t + j] == 4 * t + 1 + 2 * j
    assert mma_v_f16.key_order(("-DVC_MMA_V_F16=1", mma_v_f16.PAIRED_FLAG)) == mma_v_f16.PAIRED_KEY_ORDER
    assert mma_v_f16.key_order(("-DVC_MMA_V_F16=1",)) == mma_v_f16.KEY_ORDER


def test_scaled_unpack_is_the_code_value_over_256():
    # the f16 whose bits are code << 7 is 2^-8 times the E4M3 value, for every non-negative finite code
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)
    f16 = (codes.to(torch.int32) << 7).to(torch.int16).view(torch.float16)
    assert torch.equal(f16.float() * 256, codes.view(torch.float8_e4m3fn).float())


def test_reference_map_is_the_kernels_tile_image():
    codes = torch.randint(0, 0x7E, (2, 3, 16, 128), dtype=torch.uint8)
    got = mma_v_f16.v_f16_reference(codes)
    values = codes.view(torch.float8_e4m3fn).half()
    assert got.dtype == torch.float16 and got.shape == (2, 3, 2, 16, 64)
    for chunk in range(2):
        for row in range(16):
            for unit in range(8):
                stored = got[:, :, chunk, row, 8 * (unit ^ (row % 8)):8 * (unit ^ (row % 8)) + 8]  # swizzled<128>
                for slot in range(8):
                    position = 8 * unit + slot  # within the chunk's 64 keys
                    key = 64 * chunk + 16 * (position // 16) + mma_v_f16.KEY_ORDER[position % 16]
                    assert torch.equal(stored[..., slot], values[:, :, row, key])


def test_reference_map_refuses_a_partial_chunk():
    with pytest.raises(ValueError, match="multiple of 64"):
        mma_v_f16.v_f16_reference(torch.zeros(1, 1, 64, 80, dtype=torch.uint8))


def test_every_f16_v_build_goes_through_f16_with_fp32_pv():
    # the kernel's static_assert, seen from the registry: VC_MMA_V_F16 feeds the via-f16 MMAs' B operand
    names = [n for n in mma_variants.VARIANTS if mma_v_f16.uses_v_f16(mma_variants.flags(n))]
    assert names
    for name in names:
        flags = mma_variants.flags(name)
        assert "-DVC_MMA_E4M3_VIA_F16=1" in flags and not any(f.startswith("-DVC_MMA_PV_F16=") for f in flags)


def test_the_head_dim_128_flag_converts_only_for_int8_v_smooth_at_128():
    flags = ("-DVC_MMA_E4M3_VIA_F16=1", mma_v_f16.D128_VSMOOTH_FLAG)
    taking = [(d, fp8, vs) for d in (64, 128) for fp8 in (False, True) for vs in (False, True)
              if mma_v_f16.takes_v_f16(flags, d, fp8, vs)]
    assert taking == [(128, False, True)]
    assert mma_v_f16.uses_v_f16(flags)
    everywhere = ("-DVC_MMA_E4M3_VIA_F16=1", mma_v_f16.FLAG)
    assert all(mma_v_f16.takes_v_f16(everywhere, d, fp8, vs) for d in (64, 128) for fp8 in (False, True) for vs in (False, True))
    assert not mma_v_f16.takes_v_f16(("-DVC_MMA_E4M3_VIA_F16=1",), 128, False, True)
