"""genoflash as a transformers attention implementation, on small models built from local
configs (no hub download): outputs and gradients equal the eager implementation's."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")  # a test extra: installed by the README's test command

import genoflash  # noqa: E402
import genoflash.integrations.transformers  # noqa: E402,F401  (registers "genoflash")


def tiny_llama(attn_implementation: str, device="cpu"):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)  # the same weights for every implementation
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation)
    return model.to(device).eval()


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("padding", [None, "right", "left"])
def test_llama_logits_and_gradients_match_eager(backend, padding, device):
    eager, ours = tiny_llama("eager", device), tiny_llama("genoflash", device)
    assert ours.config._attn_implementation == "genoflash"
    ids = torch.randint(0, 64, (2, 37), device=device)
    mask = torch.ones_like(ids)
    if padding == "right":
        mask[0, 30:] = 0
    elif padding == "left":
        mask[1, :9] = 0
    kw = {} if padding is None else dict(attention_mask=mask)
    real = mask.bool()  # padded positions' outputs are not defined the same way by both
    with genoflash.use_backend(backend):
        got = ours(ids, **kw).logits
        got[real].sum().backward()
    ref = eager(ids, **kw).logits
    ref[real].sum().backward()
    torch.testing.assert_close(got[real], ref[real], rtol=1e-4, atol=1e-4)
    for (name, p), (_, q) in zip(ours.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_generation_with_a_cache_matches_eager():
    eager, ours = tiny_llama("eager"), tiny_llama("genoflash")
    ids = torch.randint(0, 64, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as generation uses
    with genoflash.use_backend("torch"):
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, eager.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False))


def test_sliding_window_matches_eager():
    config = transformers.MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    models = {}
    for impl in ("eager", "genoflash"):
        torch.manual_seed(0)
        models[impl] = transformers.MistralForCausalLM._from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(0, 64, (2, 30))
    with genoflash.use_backend("torch"):
        got = models["genoflash"](ids).logits
    torch.testing.assert_close(got, models["eager"](ids).logits, rtol=1e-4, atol=1e-4)


def test_packed_batch_equals_separate_sequences():
    """Padding-free packing (position_ids restarting per sequence): no attention across sequences."""
    ours = tiny_llama("genoflash")
    a, b = torch.randint(0, 64, (1, 11)), torch.randint(0, 64, (1, 7))
    packed = torch.cat([a, b], 1)
    position_ids = torch.cat([torch.arange(11), torch.arange(7)])[None]
    with genoflash.use_backend("torch"), torch.no_grad():
        got = ours(packed, position_ids=position_ids).logits
        separate = torch.cat([ours(a).logits, ours(b).logits], 1)
    torch.testing.assert_close(got, separate, rtol=1e-4, atol=1e-4)


def test_output_attentions_is_a_clear_error():
    ours = tiny_llama("genoflash")
    with pytest.raises(ValueError, match="output_attentions"):
        ours(torch.randint(0, 64, (1, 5)), output_attentions=True)
