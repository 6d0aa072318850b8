"""kvlab.kernels.paged_attention_torch.gather_blocks (notebook 05's gather path): the blocks come
out in table order, and every slot past a sequence's end is zero, whatever the pool held there
(NaN included), on random tables and lengths that are not multiples of the block size."""

import torch

from kvlab.kernels.paged_attention_torch import gather_blocks, paged_decode_gather


def test_gather_blocks_copies_in_table_order_and_zeroes_past_each_end():
    g = torch.Generator().manual_seed(3)
    block_size, kv_heads, dim, lens = 4, 2, 8, [1, 7, 12, 5]
    width = 3
    pool = torch.randn(16, block_size, kv_heads, dim, generator=g)
    pool[torch.rand(pool.shape, generator=g) < 0.2] = float("nan")  # garbage, even NaN
    table = torch.randperm(16, generator=g)[: len(lens) * width].reshape(len(lens), width)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    keys, values, valid = gather_blocks(pool, pool.clone(), table.int(), seq_lens)
    assert keys.shape == (len(lens), kv_heads, width * block_size, dim)
    for b, n in enumerate(lens):
        want = pool[table[b].long()].flatten(0, 1)[:n].transpose(0, 1)
        torch.testing.assert_close(keys[b, :, :n], want, equal_nan=True)
        assert valid[b].tolist() == [t < n for t in range(width * block_size)]
        assert not keys[b, :, n:].any() and not values[b, :, n:].any()


def test_gather_path_ignores_nan_past_each_end():
    g = torch.Generator().manual_seed(4)
    pool_k = torch.randn(8, 4, 1, 8, generator=g)
    pool_v = torch.randn(8, 4, 1, 8, generator=g)
    table = torch.tensor([[2, 5], [7, 0]], dtype=torch.int32)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    q = torch.randn(2, 2, 8, generator=g)
    clean = paged_decode_gather(q, pool_k, pool_v, table, lens, 0.35)
    pool_k[5, 1:], pool_v[5, 1:], pool_k[7, 3:], pool_v[0] = (float("nan"),) * 4
    torch.testing.assert_close(paged_decode_gather(q, pool_k, pool_v, table, lens, 0.35), clean)
