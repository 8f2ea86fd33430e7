"""genoflash.models: the DNA LM, the Enformer encoder, strand conjoining and checkpoints.

Tiny models on the CPU (genoflash's `torch` backend); each test says what it guards.
"""

import copy
import json
import pickle

import pytest
import torch

import genoflash
import torch.nn.functional as F

from genoflash.layers import MultiHeadAttention
from genoflash.data import A_ID, IGNORE_INDEX, MASK_ID, N_ID, T_ID, one_hot, reverse_complement
from genoflash.models import (DNALM, ConvTower, DNALMConfig, Enformer, EnformerConfig, LMOutput,
                              ReverseComplementWrapper, load_pretrained, save_pretrained)

COMPLEMENT_IDS = torch.tensor([0, 1, 2, 3, 7, 6, 5, 4, 8])  # A<->T, C<->G, specials and N kept


def tiny_lm(**overrides) -> DNALM:
    return DNALM(DNALMConfig(**{"dim": 32, "depth": 2, "nheads": 2, **overrides}))


def tiny_enformer(**overrides) -> Enformer:
    fields = {"dim": 32, "depth": 1, "nheads": 2, "channel_multiple": 8,
              "heads": {"tracks": 3}, "class_heads": {"enhancer": 2}, **overrides}
    return Enformer(EnformerConfig(**fields))


def random_bases(*shape, generator=None) -> torch.Tensor:
    """Token ids of random A/C/G/T bases."""
    return torch.randint(A_ID, T_ID + 1, shape, generator=generator)


# --- DNA language model ----------------------------------------------------------------

def test_causal_lm_shapes_and_causality():
    torch.manual_seed(0)
    model = tiny_lm().eval()
    tokens = random_bases(2, 64)
    out = model(tokens)
    assert out["logits"].shape == (2, 64, 9) and "loss" not in out and out.loss is None
    assert model(tokens, labels=tokens)["loss"].shape == ()
    changed = tokens.clone()
    changed[:, 40] = N_ID
    logits = model(changed)["logits"]
    # A causal LM's position i sees tokens 0..i only.
    torch.testing.assert_close(logits[:, :40], out["logits"][:, :40], rtol=0, atol=0)
    assert not torch.allclose(logits[:, 40:], out["logits"][:, 40:])


def test_causal_lm_learns_a_repeating_motif():
    torch.manual_seed(0)
    model = tiny_lm()
    motif = random_bases(12)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        # Random phases of the repeated motif; labels are the next base (shifted in the data).
        starts = torch.randint(0, 12, (8,))
        windows = motif[(starts[:, None] + torch.arange(65)) % 12]
        loss = model(windows[:, :-1], labels=windows[:, 1:])["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 1.5  # about ln(9) at initialisation
    assert sum(losses[-5:]) / 5 < 0.3 * losses[0], losses


def test_masked_lm_loss_counts_only_labelled_positions():
    torch.manual_seed(0)
    model = tiny_lm(causal=False).eval()
    original = random_bases(2, 64)
    masked = torch.rand(original.shape) < 0.15
    masked[0, 0] = True  # at least one target
    tokens = original.masked_fill(masked, MASK_ID)
    labels = original.masked_fill(~masked, IGNORE_INDEX)
    out = model(tokens, labels=labels)
    expected = F.cross_entropy(out["logits"][masked], original[masked])
    torch.testing.assert_close(out["loss"], expected)
    # Bidirectional: a later token changes earlier positions' predictions.
    changed = tokens.clone()
    changed[:, 50] = N_ID
    assert not torch.allclose(model(changed)["logits"][:, :10], out["logits"][:, :10])


@pytest.mark.parametrize("causal", [True, False])
def test_local_layers_see_only_their_window(causal):
    torch.manual_seed(0)
    local = tiny_lm(depth=1, layer_pattern="L", window_size=8, causal=causal).eval()
    global_ = tiny_lm(depth=1, layer_pattern="G", causal=causal).eval()
    global_.load_state_dict(local.state_dict())  # same weights; only the mask differs
    tokens = random_bases(1, 128)
    changed = tokens.clone()
    changed[0, 20] = N_ID  # 80 positions before position 100: outside any 8-token window
    for model, should_change in ((local, False), (global_, True)):
        before, after = model(tokens)["logits"][0, 100], model(changed)["logits"][0, 100]
        assert torch.equal(before, after) != should_change


def test_mamba_layers_keep_the_published_initialisation():
    """mamba-ssm's: in_proj and x_proj at nn.Linear's default (not the N(0, 0.02) of the other
    layers, which starts the state path ~80x weaker), out_proj rescaled by 1/sqrt(residual branches)."""
    from genoflash.layers import Mamba

    for ffn_mult, branches in ((8 / 3, 2), (0.0, 1)):
        torch.manual_seed(0)
        model = tiny_lm(dim=64, depth=4, mixer="mamba", ffn_mult=ffn_mult)
        m = model.blocks[0].mixer.mamba
        torch.manual_seed(1)
        fresh = Mamba(64)  # its own initialisation, drawn again: the same distribution
        for name in ("in_proj", "x_proj"):
            assert float(getattr(m, name).weight.std()) == pytest.approx(float(getattr(fresh, name).weight.std()),
                                                                         rel=0.1), name
        expected = float(fresh.out_proj.weight.std()) / (4 * branches) ** 0.5
        assert float(m.out_proj.weight.std()) == pytest.approx(expected, rel=0.1)
        if ffn_mult:
            assert float(model.blocks[0].ffn.out.weight.std()) == pytest.approx(0.02, rel=0.1)
    attention = tiny_lm(dim=64)
    assert float(attention.blocks[0].mixer.q_proj.weight.std()) == pytest.approx(0.02, rel=0.1)


def test_ffn_mult_0_gives_mixer_only_blocks():
    model = tiny_lm(mixer="mamba", ffn_mult=0)
    assert all(block.ffn is None and block.ffn_norm is None for block in model.blocks)
    tokens = random_bases(2, 17)
    out = model(tokens, labels=tokens)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.logits.shape == (2, 17, 9)
    with pytest.raises(ValueError, match="ffn_mult"):
        tiny_lm(ffn_mult=-1.0)


def test_layer_pattern_repeats_to_depth():
    model = tiny_lm(depth=4, layer_pattern="LG", window_size=16, causal=False)
    assert model.config.layer_letters == "LGLG"
    assert [block.mixer.window_size for block in model.blocks] == [(16, 16), (-1, -1)] * 2
    with pytest.raises(ValueError, match="whole number of times"):
        DNALMConfig(dim=32, depth=4, nheads=2, layer_pattern="LLG")
    with pytest.raises(ValueError, match="letters"):
        DNALMConfig(dim=32, depth=2, nheads=2, layer_pattern="LX")


@pytest.mark.parametrize("dim, nheads, head_dim", [(16, 4, None), (60, 6, None), (512, 1, None), (64, 2, 264)])
def test_an_attention_head_dim_the_kernels_cannot_take_fails_when_the_layer_is_made(dim, nheads, head_dim):
    # Not at the first forward (after a run had started): head dims are multiples of 8 up to 256.
    with pytest.raises(ValueError, match=r"the head dim \((dim // nheads|head_dim) .* must be a multiple of 8"):
        MultiHeadAttention(dim, nheads, head_dim=head_dim)
    if head_dim is None and dim // nheads < 8:
        with pytest.raises(ValueError, match="must be a multiple of 8"):
            DNALM(DNALMConfig(dim=dim, depth=1, nheads=nheads))
    assert MultiHeadAttention(24, 1).head_dim == 24  # not a power of two: taken


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = tiny_lm(attn_dropout=0.1, nheads_k=1)  # dropout: the recompute must redraw the same mask
    checkpointed = tiny_lm(attn_dropout=0.1, nheads_k=1, gradient_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    tokens = random_bases(2, 64)
    grads = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)
        model(tokens, labels=tokens)["loss"].backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_packed_batch_equals_separate_sequences():
    torch.manual_seed(0)
    model = tiny_lm(causal=False).eval()
    first, second = random_bases(1, 40), random_bases(1, 24)
    cu_seqlens = torch.tensor([0, 40, 64], dtype=torch.int32)
    packed = model(torch.cat([first, second], dim=1)[0], cu_seqlens=cu_seqlens)["logits"]
    separate = torch.cat([model(first)["logits"][0], model(second)["logits"][0]])
    torch.testing.assert_close(packed, separate, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("pattern,nheads_k", [("G", None), ("LG", 1)], ids=["global-mha", "local-global-mqa"])
def test_chunks_through_the_kv_cache_equal_one_forward(pattern, nheads_k, backend, device):
    """Prefill, then continuations of odd lengths (1, 17, ...) from copies of the cache: each chunk's
    logits are the full forward's at its positions (RoPE offsets, causal and window masks across the
    chunk boundary). On the triton backend the short chunks take the split-KV decoding kernel."""
    torch.manual_seed(0)
    model = tiny_lm(layer_pattern=pattern, nheads_k=nheads_k, window_size=7).to(device).eval()
    prefix = random_bases(1, 29).to(device)
    tails = random_bases(3, 19).to(device)
    with torch.no_grad(), genoflash.use_backend(backend):
        full = model(torch.cat([prefix.expand(3, -1), tails], dim=1))["logits"]
        caches = model.new_kv_cache(1, 29)
        torch.testing.assert_close(model(prefix, kv_cache=caches)["logits"], full[:1, :29], rtol=1e-5, atol=1e-5)
        assert [c.seqlen for c in caches] == [29] * 2
        caches = [c.select(torch.tensor([0, 0, 0]), 48) for c in caches]
        got = torch.cat([model(tails[:, :1], kv_cache=caches)["logits"],
                         model(tails[:, 1:18], kv_cache=caches)["logits"],
                         model(tails[:, 18:], kv_cache=caches)["logits"]], dim=1)
    torch.testing.assert_close(got, full[:, 29:], rtol=1e-5, atol=1e-5)


def test_num_labels_makes_a_per_base_classifier_with_its_own_head():
    torch.manual_seed(0)
    model = tiny_lm(causal=False, num_labels=5)
    assert model.lm_head.weight is not model.embed.weight and model.lm_head.weight.shape == (5, 32)
    tokens = random_bases(2, 33)
    labels = torch.randint(0, 5, (2, 33))
    labels[0, :4] = IGNORE_INDEX
    out = model(tokens, labels=labels)
    assert out["logits"].shape == (2, 33, 5)
    want = F.cross_entropy(out["logits"].reshape(-1, 5), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(out["loss"], want)
    lm = tiny_lm()
    assert lm.lm_head.weight is lm.embed.weight
    for bad in (1, True, 2.0):
        with pytest.raises(ValueError, match="num_labels must be None"):
            DNALMConfig(num_labels=bad)


def test_kv_cache_misuse_is_named():
    torch.manual_seed(0)
    model = tiny_lm().eval()
    with pytest.raises(ValueError, match="a KV cache needs a causal LM"):
        tiny_lm(causal=False).new_kv_cache(1, 8)
    caches = model.new_kv_cache(2, 8)
    with torch.no_grad():
        with pytest.raises(ValueError, match="kv_cache holds 2 sequences, but x has batch 1"):
            model(random_bases(1, 4), kv_cache=caches)
        model(random_bases(2, 5), kv_cache=caches)
        with pytest.raises(ValueError, match="5 cached \\+ 4 new tokens exceed its capacity 8"):
            model(random_bases(2, 4), kv_cache=caches)
        with pytest.raises(TypeError, match="a list of 2 KVCache"):
            model(random_bases(2, 1), kv_cache=caches[:1])
    with pytest.raises(ValueError, match="rows must index this cache's 2 rows"):
        caches[0].select(torch.tensor([2]))
    with pytest.raises(ValueError, match="capacity \\(4\\) must hold the 5 cached tokens"):
        caches[0].select(torch.tensor([0]), 4)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("kw,mixers", [
    (dict(mixer="hyena"), ["HyenaMixer", "HyenaMixer"]),
    (dict(layer_pattern="HG"), ["HyenaMixer", "MultiHeadAttention"]),
    (dict(mixer="mamba"), ["MambaMixer", "MambaMixer"]),
    (dict(layer_pattern="MH"), ["MambaMixer", "HyenaMixer"]),
], ids=["hyena", "hyena+attention", "mamba", "mamba+hyena"])
def test_hyena_mamba_and_hybrid_lms_train_and_keep_causality(kw, mixers, causal):
    torch.manual_seed(5)
    model = tiny_lm(causal=causal, hyena_l_max=256, **kw)
    assert [type(b.mixer).__name__ for b in model.blocks] == mixers
    if "MambaMixer" in mixers:  # a masked LM reads both ways
        assert type(model.blocks[0].mixer.mamba).__name__ == ("Mamba" if causal else "BiMamba")
    tokens = random_bases(2, 37)
    out = model(tokens, labels=tokens)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # Position 20's logits move with a change at position 30 only when the model looks ahead.
    # In float64, so that the FFT's round-off (which spreads over all positions) is ~1e-16.
    changed = tokens.clone()
    changed[:, 30] = (changed[:, 30] - 4 + 1) % 4 + 4
    model = model.double()
    with torch.no_grad(), genoflash.use_backend("torch"):
        delta = (model(changed)["logits"][:, 20] - model(tokens)["logits"][:, 20]).abs().max().item()
    assert (delta < 1e-12) if causal else (delta > 1e-8), delta


def test_mixer_shorthand_conflicts_with_a_pattern():
    with pytest.raises(ValueError, match="mixer='hyena' makes every layer H"):
        tiny_lm(mixer="hyena", depth=2, layer_pattern="LG")


@pytest.mark.parametrize("mixer", ["hyena", "mamba"])
def test_hyena_and_mamba_layers_refuse_packed_input(mixer):
    model = tiny_lm(mixer=mixer, hyena_l_max=64)
    with pytest.raises(ValueError, match="packed"):
        model(random_bases(1, 10)[0], cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


def test_unknown_mixer_is_an_error():
    with pytest.raises(ValueError, match="unknown mixer 'transformer'.*attention, hyena, mamba"):
        tiny_lm(mixer="transformer")


# --- Hugging Face's calling convention ---------------------------------------------------

def test_input_ids_is_the_tokens_argument_under_hugging_faces_name():
    torch.manual_seed(0)
    model = tiny_lm().eval()
    tokens = random_bases(2, 33)
    expected = model(tokens, labels=tokens)
    got = model(input_ids=tokens, labels=tokens)
    assert torch.equal(got["logits"], expected["logits"]) and torch.equal(got["loss"], expected["loss"])
    with pytest.raises(TypeError, match="tokens or as input_ids, one of the two; got both"):
        model(tokens, input_ids=tokens)
    with pytest.raises(TypeError, match="got neither"):
        model(labels=tokens)
    with pytest.raises(ValueError, match=r"labels must have the tokens' shape \(2, 33\), got \(2, 32\)"):
        model(tokens, labels=tokens[:, 1:])


def test_output_is_a_dict_that_indexes_like_a_tuple_loss_first():
    torch.manual_seed(0)
    model = tiny_lm().eval()
    tokens = random_bases(2, 16)
    with torch.no_grad():  # deepcopy takes graph leaves only
        out = model(input_ids=tokens, labels=tokens)
    assert isinstance(out, LMOutput) and isinstance(out, dict) and list(out) == ["loss", "logits"]
    assert out[0] is out["loss"] is out.loss and out[1] is out["logits"] is out.logits and out.loss.shape == ()
    assert out[1:] == (out.logits,) and out.to_tuple() == (out.loss, out.logits)
    plain = model(tokens)
    assert list(plain) == ["logits"] and plain.loss is None and plain[0] is plain["logits"]
    with pytest.raises(KeyError):
        plain["loss"]
    with pytest.raises(AttributeError, match="no field 'hidden_states'"):
        plain.hidden_states
    for again in (pickle.loads(pickle.dumps(out)), copy.deepcopy(out), type(out)((k, v) for k, v in out.items())):
        assert type(again) is LMOutput and list(again) == ["loss", "logits"] and torch.equal(again[1], out.logits)
    with pytest.raises(TypeError, match="has the fields loss, logits; got logit"):
        LMOutput(logit=out.logits)


def _padded(sequences, seqlen, side, pad=0):
    tokens = torch.full((len(sequences), seqlen), pad, dtype=torch.long)
    mask = torch.zeros(len(sequences), seqlen, dtype=torch.long)  # 0/1, as tokenizers give it
    for row, sequence in enumerate(sequences):
        at = slice(0, len(sequence)) if side == "right" else slice(seqlen - len(sequence), seqlen)
        tokens[row, at], mask[row, at] = sequence, 1
    return tokens, mask


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_padded_batch_equals_each_sequence_alone(causal, side):
    """Attention layers: logits of the real tokens equal those of each sequence run alone (padding is
    packed away, RoPE positions start at the first real token); padding's logits are 0 and its labels,
    whatever they hold, are not counted."""
    torch.manual_seed(0)
    model = tiny_lm(causal=causal, layer_pattern="LG", window_size=8)
    sequences = [random_bases(23), random_bases(40), random_bases(1)]
    tokens, mask = _padded(sequences, 40, side)
    labels = random_bases(3, 40)  # real bases at the padding too: the mask must drop them
    out = model(input_ids=tokens, labels=labels, attention_mask=mask)
    assert out.logits.shape == (3, 40, 9) and (out.logits[mask == 0] == 0).all()
    alone = [model(seq[None], labels=labels[row][mask[row].bool()][None]) for row, seq in enumerate(sequences)]
    for row, seq in enumerate(sequences):
        torch.testing.assert_close(out.logits[row][mask[row].bool()], alone[row].logits[0], rtol=1e-5, atol=1e-5)
    lengths = torch.tensor([len(seq) for seq in sequences], dtype=torch.float32)
    expected = sum(a.loss * n for a, n in zip(alone, lengths)) / lengths.sum()  # the mean over real positions
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    everything = torch.ones_like(mask)
    assert torch.equal(model(tokens, attention_mask=everything).logits, model(tokens).logits)


@pytest.mark.parametrize("mixer", ["hyena", "mamba"])
def test_hyena_and_mamba_take_a_right_padded_batch_in_a_causal_model(mixer):
    torch.manual_seed(0)
    model = tiny_lm(mixer=mixer, hyena_l_max=64).eval()
    sequences = [random_bases(30), random_bases(17)]
    tokens, mask = _padded(sequences, 30, "right", pad=N_ID)
    labels = tokens.clone()
    out = model(tokens, labels=labels, attention_mask=mask)
    alone = [model(seq[None], labels=seq[None]) for seq in sequences]
    for row, seq in enumerate(sequences):
        torch.testing.assert_close(out.logits[row, :len(seq)], alone[row].logits[0], rtol=1e-4, atol=1e-5)
    assert (out.logits[1, 17:] == 0).all()
    expected = (alone[0].loss * 30 + alone[1].loss * 17) / 47
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)
    left_tokens, left_mask = _padded(sequences, 30, "left")
    with pytest.raises(ValueError, match="attention_mask: Hyena and Mamba layers read a padded batch only in a causal"):
        model(left_tokens, attention_mask=left_mask)
    with pytest.raises(ValueError, match="attention_mask: Hyena and Mamba"):
        tiny_lm(mixer=mixer, causal=False, hyena_l_max=64)(tokens, attention_mask=mask)


def test_bad_attention_masks_are_named():
    model = tiny_lm()
    tokens = random_bases(2, 10)
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seqlen\).*\(2, 9\)"):
        model(tokens, attention_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match="attention_mask .* and cu_seqlens .* exclude each other"):
        model(tokens, attention_mask=torch.ones(2, 10), cu_seqlens=torch.tensor([0, 10, 20], dtype=torch.int32))
    mask = torch.ones(2, 10)
    mask[1] = 0
    with pytest.raises(ValueError, match="every sequence needs at least one real token"):
        model(tokens, attention_mask=mask)


# --- Enformer --------------------------------------------------------------------------

@pytest.mark.parametrize("pooling", ["attention", "max"])
def test_enformer_predicts_one_row_per_128bp_bin(pooling):
    torch.manual_seed(0)
    model = tiny_enformer(pooling=pooling)
    out = model(one_hot(random_bases(2, 512)))
    assert out["tracks"].shape == (2, 4, 3) and (out["tracks"] >= 0).all()  # softplus
    assert out["enhancer"].shape == (2, 2)
    with pytest.raises(ValueError, match="multiple of bin_size"):
        model(one_hot(random_bases(2, 500)))


def test_enformer_takes_token_ids_as_input_ids():
    torch.manual_seed(0)
    model = tiny_enformer().eval()
    tokens = random_bases(2, 256)
    tokens[:, 10:20] = N_ID
    expected, got = model(one_hot(tokens)), model(input_ids=tokens.to(torch.uint8))
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    with pytest.raises(TypeError, match="one-hot \\(onehot\\) or token ids \\(input_ids\\), one of the two; got both"):
        model(one_hot(tokens), input_ids=tokens)
    with pytest.raises(ValueError, match="input_ids must be integer token ids"):
        model(input_ids=one_hot(tokens))


def test_enformer_tower_channels_follow_the_paper():
    assert EnformerConfig().tower_channels == [768, 896, 1024, 1152, 1280, 1536]


def test_encode_long_equals_forward(monkeypatch):
    torch.manual_seed(0)
    model = tiny_enformer().eval()
    tokens = random_bases(2, 128 * 20)
    tokens[:, 300:700] = N_ID
    expected = model(one_hot(tokens))
    assert model.tower.context_bins >= 1
    inputs = [
        (tokens.to(torch.uint8), None, 3),   # 1 byte per base, many chunk edges
        (one_hot(tokens), None, 7),          # already one-hot
        (lambda start, end: tokens[:, start:end], tokens.shape[1], 4),  # fetched on demand
        (tokens, None, 1000),                # one chunk
    ]
    for sequence, length, chunk_bins in inputs:
        out = model.encode_long(sequence, length, chunk_bins=chunk_bins)
        for name in expected:
            torch.testing.assert_close(out[name], expected[name], rtol=1e-5, atol=1e-6)
    # The comparison can fail: without the context the chunk edges see zero padding.
    monkeypatch.setattr(ConvTower, "context_bins", property(lambda self: 0))
    assert not torch.allclose(model.encode_long(tokens, chunk_bins=3)["tracks"], expected["tracks"])


# --- Reverse-complement conjoining -----------------------------------------------------

def test_rc_wrapper_makes_an_enformer_strand_invariant():
    torch.manual_seed(0)
    model = tiny_enformer().eval()
    x = one_hot(random_bases(2, 512))
    forward, reverse = model(x), model(reverse_complement(x))
    assert not torch.allclose(forward["tracks"], reverse["tracks"].flip(1), atol=1e-4)  # not symmetric
    wrapped = ReverseComplementWrapper(model)
    forward, reverse = wrapped(x), wrapped(reverse_complement(x))
    torch.testing.assert_close(forward["tracks"], reverse["tracks"].flip(1))
    torch.testing.assert_close(forward["enhancer"], reverse["enhancer"])


def test_rc_wrapper_on_tokens_complements_the_vocabulary_axis():
    torch.manual_seed(0)
    model = tiny_lm(causal=False).eval()
    tokens = random_bases(2, 64)
    wrapped = ReverseComplementWrapper(model)
    forward, reverse = wrapped(tokens)["logits"], wrapped(reverse_complement(tokens))["logits"]
    torch.testing.assert_close(forward, reverse.flip(1)[..., COMPLEMENT_IDS])
    assert not torch.allclose(forward, reverse.flip(1))  # the complement is not optional
    with pytest.raises(ValueError, match="causal"):
        ReverseComplementWrapper(tiny_lm(causal=True))


# --- Checkpoints -----------------------------------------------------------------------

@pytest.mark.parametrize("make, inputs", [
    (lambda: tiny_lm(nheads_k=1, layer_pattern="LG", window_size=16), lambda: random_bases(2, 64)),
    (lambda: tiny_lm(tie_embeddings=False, causal=False), lambda: random_bases(2, 64)),
    (tiny_enformer, lambda: one_hot(random_bases(1, 256))),
])
def test_save_load_round_trip_is_exact(tmp_path, make, inputs):
    torch.manual_seed(0)
    model, x = make().eval(), inputs()
    save_pretrained(model, tmp_path / "ckpt")
    loaded = load_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config and not loaded.training
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["model_type"] in ("dna_lm", "enformer")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    expected, got = model(x), loaded(x)
    for name, value in expected.items():
        assert (value is None and got[name] is None) or torch.equal(got[name], value)
    if isinstance(model, DNALM) and model.config.tie_embeddings:
        assert loaded.lm_head.weight is loaded.embed.weight


def test_small_enformer_widths_keep_every_conv_non_empty():
    """dim below 2 x channel_multiple used to round the middle tower stages to 0 channels."""
    from genoflash.models import Enformer, EnformerConfig

    config = EnformerConfig(dim=32, depth=1, nheads=2, heads={"t": 3})
    assert all(c >= 16 for c in config.tower_channels) and config.tower_channels[-1] == 32
    out = Enformer(config)(torch.zeros(1, 256, 4).index_fill_(2, torch.tensor([1]), 1.0))
    assert out["t"].shape == (1, 2, 3)
