"""kvlab.lab.cache_bytes: the bytes real Llama, Mamba and Jamba caches hold, against the formulas of
9.6."""

import torch

import kvlab
from kvlab.lab.cache_bytes import cache_nbytes, layer_kinds
from kvlab.theory.ssm import attention_kv_bytes, hybrid_cache_bytes
from kvlab.versions import returned_cache


def test_cache_bytes_match_real_llama_mamba_and_jamba_caches():
    import transformers

    llama = kvlab.tiny_model(
        "llama", layers=3, hidden=64, q_heads=4, kv_heads=2, intermediate=64, vocab=128
    )
    mamba = kvlab.tiny_model("mamba", layers=3, hidden=32, state_size=4, vocab=128)
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        kv = cache_nbytes(returned_cache(llama(ids, use_cache=True)))
        state = cache_nbytes(returned_cache(mamba(ids, use_cache=True)))
    assert kv == 3 * attention_kv_bytes(9, kv_width=2 * 16, bytes_per_element=4)
    assert kv == 9 * llama.shape.kv_bytes_per_token(4)
    # transformers keeps the whole window of conv_kernel inputs, one more than the next output needs
    assert state == mamba.shape.state_bytes_per_sequence(4, conv_inputs=mamba.shape.conv_kernel)
    assert state > mamba.shape.state_bytes_per_sequence(4)
    torch.manual_seed(0)
    config = transformers.JambaConfig(
        hidden_size=32,
        num_hidden_layers=4,
        vocab_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_experts=1,
        num_experts_per_tok=1,
        attn_layer_period=2,
        attn_layer_offset=1,
        mamba_d_state=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        mamba_d_conv=4,
    )
    jamba = transformers.JambaForCausalLM(config).eval()
    with torch.no_grad():
        cache = returned_cache(jamba(ids, use_cache=True))
    assert layer_kinds(cache) == ["ssm", "attention", "ssm", "attention"]
    ssm_layer = kvlab.theory.shapes.SSMShape("jamba-ssm", 1, 32, 4, 128, expand=2, conv_kernel=4)
    want = hybrid_cache_bytes(
        9,
        layers=4,
        attention_layers=2,
        kv_bytes_per_token=2 * 2 * 8 * 4,
        state_bytes=ssm_layer.state_bytes_per_layer(4, conv_inputs=4),
    )
    assert cache_nbytes(cache) == want
