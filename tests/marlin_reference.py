"""Pure-torch references of the Marlin weight format, written from its description
(not from any kernel): GPTQ and AWQ packing, the Marlin tile layout, and the float64
dequantized weight. Shared by test_marlin.py (CPU) and test_cuda_marlin.py."""

from __future__ import annotations

import torch

AWQ_ORDER = {4: [0, 2, 4, 6, 1, 3, 5, 7], 8: [0, 2, 1, 3]}


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit words -> the same bits as int32."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_gptq(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q [K, N] (values < 2**bits) -> GPTQ int32 [K / pack, N]: row k at bits (k % pack) * bits."""
    pack = 32 // bits
    k, n = q.shape
    rows = q.to(torch.int64).reshape(k // pack, pack, n)
    shifts = (torch.arange(pack, dtype=torch.int64) * bits).reshape(1, pack, 1)
    return _to_int32((rows << shifts).sum(dim=1))


def pack_awq(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q [K, N] -> AWQ int32 [K, N / pack]: slot i of a word holds column AWQ_ORDER[i]."""
    pack = 32 // bits
    k, n = q.shape
    cols = q.to(torch.int64).reshape(k, n // pack, pack)[:, :, AWQ_ORDER[bits]]
    shifts = torch.arange(pack, dtype=torch.int64) * bits
    return _to_int32((cols << shifts).sum(dim=2))


def marlin_layout(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q [K, N] in Marlin row order -> Marlin int32 [K / 16, N * 16 * bits / 32].

    Each 16 x 64 tile (k16 tile kt, 64-column tile nt) is a run of 16 * 64 * bits / 32
    words at row kt. Lane l (g = l // 4, t = l % 4) and 16-column block w of a tile
    own rows 2t + (0, 1, 8, 9) of columns 16w + g and 16w + g + 8. 4-bit: one word at
    4 l + w whose nibbles, low to high, are (row, column offset) (0, 0) (8, 0) (0, 8)
    (8, 8) (1, 0) (9, 0) (1, 8) (9, 8). 8-bit: words 8 l + 2 w (column g) and + 1
    (column g + 8), bytes low to high rows 0, 8, 1, 9.
    """
    k, n = q.shape
    q = q.to(torch.int64)
    tile_words = 16 * 64 * bits // 32
    out = torch.zeros(k // 16, n // 64, tile_words, dtype=torch.int64)
    tiles = q.reshape(k // 16, 16, n // 64, 64).permute(0, 2, 1, 3)  # [kt, nt, 16, 64]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for w in range(4):
            col = 16 * w + g
            if bits == 4:
                slots = [(0, 0), (8, 0), (0, 8), (8, 8), (1, 0), (9, 0), (1, 8), (9, 8)]
                word = sum(
                    tiles[:, :, 2 * t + dr, col + dc] << (4 * i) for i, (dr, dc) in enumerate(slots)
                )
                out[:, :, 4 * lane + w] = word
            else:
                for half in range(2):
                    word = sum(
                        tiles[:, :, 2 * t + dr, col + 8 * half] << (8 * i)
                        for i, dr in enumerate((0, 8, 1, 9))
                    )
                    out[:, :, 8 * lane + 2 * w + half] = word
    return _to_int32(out.reshape(k // 16, -1))


def dequantize(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | float, groups_of_rows: torch.Tensor
) -> torch.Tensor:
    """float64 [K, N]: (q[k, n] - zero[g, n]) * scale[g, n], g = groups_of_rows[k].

    ``scales`` / ``zeros`` are the unpermuted [num_groups, N] values (``zeros`` may be
    a number: the type's bias)."""
    g = groups_of_rows.long()
    s = scales.double()[g]
    z = zeros.double()[g] if isinstance(zeros, torch.Tensor) else zeros
    return (q.double() - z) * s
