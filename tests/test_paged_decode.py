"""A Hugging Face Llama decoding on the paged KV cache and the Triton kernel (section 9.5).

The oracle is Hugging Face's own ``generate`` (greedy, its own cache and attention), run on each
prompt alone. The paged run batches prompts of different lengths without padding, and decodes
through ``paged_decode_attention`` (the Triton kernel; under the interpreter on a CPU).
"""

import pytest
import torch

import kvlab
from kvlab.kernels import paged_decode_attention_ref
from kvlab.serving.paged_decode import ATTN_NAME, PagedBatch, compare_attention, measure_preemption_cost, paged_decode_attention_gather, paged_generate
from kvlab.cache.paged import OutOfBlocksError

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("llama", layers=2, hidden=128, q_heads=4, kv_heads=2, vocab=512, intermediate=256,
                            device="cpu", dtype=torch.float32, seed=3)


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in lengths]


def _generate_each(model, prompts, new_tokens):
    model.set_attn_implementation("sdpa")
    out = [model.generate(torch.tensor([p]), max_new_tokens=new_tokens, do_sample=False)[0, len(p):].tolist()
           for p in prompts]
    return out


@pytest.mark.parametrize("lengths", [[7], [5, 17, 3]])
def test_paged_decode_matches_generate(model, lengths):
    prompts = _prompts(lengths)
    expected = _generate_each(model, prompts, NEW_TOKENS)
    run = paged_generate(model, prompts, NEW_TOKENS, block_size=4)
    assert model.config._attn_implementation == ATTN_NAME
    assert run.tokens == expected and run.preemptions == 0


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_keeps_the_tokens(model, preemption):
    prompts = _prompts([7, 7, 3], seed=1)
    expected = _generate_each(model, prompts, NEW_TOKENS)
    # 5 blocks of 4 admit all three (2 + 2 + 1 blocks), but they grow to 3 + 3 + 3: someone is preempted.
    run = paged_generate(model, prompts, NEW_TOKENS, block_size=4, num_blocks=5, preemption=preemption)
    assert run.tokens == expected
    assert run.preemptions >= 1 and run.peak_blocks <= 5
    assert (run.recomputed_tokens > 0) == (preemption == "recompute")
    assert (run.swapped_blocks > 0) == (preemption == "swap")


def test_bad_arguments(model):
    with pytest.raises(OutOfBlocksError, match="need 4 KV-cache block.* bytes needed"):
        paged_generate(model, _prompts([10]), NEW_TOKENS, block_size=4, num_blocks=3)
    with pytest.raises(ValueError, match="preemption must be one of"):
        paged_generate(model, _prompts([3]), 2, preemption="drop")
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        paged_generate(model, _prompts([3]), 0)
    kvlab.serving.paged_decode.use_paged_attention(model)
    with pytest.raises(ValueError, match="needs the paged= keyword"):
        model(torch.tensor([[1, 2]]), use_cache=False)


def test_gather_path_matches_reference():
    """The vectorised PyTorch paged path against the kernels' reference, permuted table, ragged lengths."""
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(20, 4, 2, 32, generator=gen), torch.randn(20, 4, 2, 32, generator=gen)
    table = torch.randperm(20, generator=gen)[:15].reshape(3, 5).to(torch.int32)
    lens = torch.tensor([1, 13, 20], dtype=torch.int32)
    q = torch.randn(3, 8, 32, generator=gen)
    torch.testing.assert_close(paged_decode_attention_gather(q, k_cache, v_cache, table, lens),
                               paged_decode_attention_ref(q, k_cache, v_cache, table, lens))


def test_measurement_helpers_run(model):
    timing = compare_attention(2, 40, block_size=8, num_q_heads=4, num_kv_heads=2, head_dim=32, reps=1, warmup=0)
    assert timing.kv_bytes == 2 * 2 * 40 * 2 * 32 * 4 and timing.path == "gather"
    cost = measure_preemption_cost(model, 10, block_size=4, reps=1, warmup=0)
    assert (cost.tokens, cost.blocks) == (10, 3)
    assert cost.swap_bytes == 2 * 3 * (2 * 2 * 4 * 2 * 32 * 4)  # out and back, K and V of 2 layers


def test_paged_batch_is_plain_data(model):
    cache = kvlab.serving.paged_decode.cache_for(model, 4, 4)
    batch = PagedBatch(cache, [cache.new_sequence()])
    assert batch.attention == "kernel" and cache.num_layers == 2 and cache.head_dim == 32
