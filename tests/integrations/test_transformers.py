"""genoflash as a transformers attention implementation, on small models built from local
configs (no hub download): outputs and gradients equal the eager implementation's; and genoflash's DNALM
under transformers' Trainer."""

from __future__ import annotations

import inspect
import math

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


@pytest.mark.parametrize("backend", ["torch", "triton"])  # triton: each step on the split-KV decoding kernel
@pytest.mark.parametrize("padding", [None, "left", "holes"])
def test_generation_with_a_cache_matches_eager(backend, padding, device):
    eager, ours = tiny_llama("eager", device), tiny_llama("genoflash", device)
    ids = torch.randint(0, 64, (3, 12), device=device)
    mask = torch.ones_like(ids)
    if padding == "left":  # as generation pads
        mask[1, :3] = 0
    elif padding == "holes":  # padding inside the cache: the kernel skips single slots
        mask[0, 4:6] = 0
        mask[2, :1] = 0
    with genoflash.use_backend(backend):
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, eager.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("padding", [None, "left"])
def test_static_cache_generation_matches_eager(backend, padding, device):
    """generate(cache_implementation="static"): K/V hold every allocated slot, the mask only the
    filled ones; the tokens equal eager's."""
    eager, ours = tiny_llama("eager", device), tiny_llama("genoflash", device)
    ids = torch.randint(0, 64, (2, 10), device=device)
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :4] = 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, cache_implementation="static")
    with genoflash.use_backend(backend):
        got = ours.generate(ids, **kw)
    assert torch.equal(got, eager.generate(ids, **kw))


def test_decoding_steps_match_eager_logits(device):
    """Each decoding step's logits, not only the argmax: the split kernel against eager, with the
    cache split into parts of 16 keys or more (batch 2, left padding)."""
    from genoflash.ops.attention import decode

    eager, ours = tiny_llama("eager", device), tiny_llama("genoflash", device)
    ids = torch.randint(0, 64, (2, 70), device=device)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    kw = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, output_logits=True,
              return_dict_in_generate=True)
    with genoflash.use_backend("triton"), decode.use_config(min_keys_per_split=16):
        got = ours.generate(ids, **kw)
    ref = eager.generate(ids, **kw)
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(got.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_decoding_step_compiles_as_one_graph(device):
    """transformers compiles a static cache's decoding step: the step traces without a graph break
    (the kernels behind one custom op) and equals the eager step."""
    from genoflash.integrations.transformers import genoflash_attention_forward

    torch.manual_seed(15)
    module = torch.nn.Linear(1, 1).to(device)
    module.is_causal = True
    q = torch.randn(2, 4, 1, 16, device=device)
    k, v = (torch.randn(2, 2, 40, 16, device=device) for _ in range(2))
    mask = torch.ones(2, 40, dtype=torch.bool, device=device)
    mask[0, :7] = False

    def step(q, k, v, mask):
        return genoflash_attention_forward(module, q, k, v, mask, scaling=0.25)[0]

    with genoflash.use_backend("triton"):
        want = step(q, k, v, mask)
        torch._dynamo.reset()
        got = torch.compile(step, backend="eager", fullgraph=True)(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_sliding_window_generation_matches_eager(device):
    """Decoding past a sliding window (8 tokens, prompts of 12 with left padding): the window counts
    positions, as eager's mask does."""
    config = transformers.MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    models = {}
    for impl in ("eager", "genoflash"):
        torch.manual_seed(0)
        models[impl] = transformers.MistralForCausalLM._from_config(config, attn_implementation=impl).to(device).eval()
    ids = torch.randint(0, 64, (2, 12), device=device)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
    with genoflash.use_backend("triton"):
        got = models["genoflash"].generate(ids, **kw)
    assert torch.equal(got, models["eager"].generate(ids, **kw))


def test_autocast_with_float32_weights_matches_eager():
    """Under autocast with float32 weights, RoPE leaves q and k in float32 beside a bfloat16 v:
    they are cast to the autocast dtype, as transformers' FlashAttention path does."""
    eager, ours = tiny_llama("eager"), tiny_llama("genoflash")
    ids = torch.randint(0, 64, (2, 33))
    with torch.autocast("cpu", dtype=torch.bfloat16), genoflash.use_backend("torch"):
        got = ours(ids).logits
        got.float().sum().backward()
        ref = eager(ids).logits
    assert got.dtype == ref.dtype
    # bfloat16 attention on both sides: within a few bfloat16 roundings of each other
    torch.testing.assert_close(got.float(), ref.float(), rtol=3e-2, atol=3e-2)
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None)


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


def test_packing_is_read_once_per_position_ids_tensor(monkeypatch):
    """Telling a packed batch from one sequence reads position_ids on the host (a device sync); the
    layers of one forward share the tensor, so it is read once, and again only for another tensor or
    after an in-place change. Inference tensors (no version counter) are read each time."""
    from genoflash.integrations import transformers as integration

    reads = []
    real = integration._read_boundaries
    monkeypatch.setattr(integration, "_read_boundaries", lambda pos, n: reads.append(n) or real(pos, n))
    one = torch.arange(5)[None]
    for _ in range(3):  # three layers
        assert integration._packed_boundaries(one, 1, 5, 5) is None
    assert len(reads) == 1
    packed = torch.tensor([[0, 1, 2, 0, 1]])
    assert integration._packed_boundaries(packed, 1, 5, 5).tolist() == [0, 3, 5]
    assert integration._packed_boundaries(packed, 1, 5, 5).tolist() == [0, 3, 5]
    assert len(reads) == 2
    packed[0, 3:] = torch.tensor([3, 4])  # now one sequence, changed in place
    assert integration._packed_boundaries(packed, 1, 5, 5) is None
    assert len(reads) == 3
    with torch.inference_mode():
        frozen = torch.tensor([[0, 1, 0, 1, 2]])
    assert integration._packed_boundaries(frozen, 1, 5, 5).tolist() == [0, 2, 5]
    assert integration._packed_boundaries(frozen, 1, 5, 5).tolist() == [0, 2, 5]
    assert len(reads) == 5


def test_output_attentions_is_a_clear_error():
    ours = tiny_llama("genoflash")
    with pytest.raises(ValueError, match="output_attentions"):
        ours(torch.randint(0, 64, (1, 5)), output_attentions=True)


# --- genoflash's DNALM under transformers' Trainer ---------------------------------------

def _tiny_dna_lm():
    from genoflash.models import DNALM, DNALMConfig

    torch.manual_seed(0)
    return DNALM(DNALMConfig(dim=32, depth=2, nheads=2, layer_pattern="LG", window_size=16))


def test_dna_lm_meets_the_trainers_calling_convention():
    """What the Trainer does with a model, with transformers' own helpers: it keeps the dataset's columns
    that forward names (GenomeWindowDataset's chrom and start go), finds the labels argument by name,
    calls model(**batch) and reads outputs["loss"] for training and the non-loss values as predictions."""
    from transformers.data.data_collator import default_data_collator
    from transformers.trainer_utils import RemoveColumnsCollator
    from transformers.utils.generic import find_labels

    from genoflash.data import GenomeWindowDataset, example_fasta

    model = _tiny_dna_lm()
    label_names = find_labels(type(model))
    assert label_names == ["labels"]
    columns = list(inspect.signature(model.forward).parameters) + ["label", "label_ids"] + label_names
    assert {"input_ids", "attention_mask", "labels"} <= set(columns)
    dataset = GenomeWindowDataset(example_fasta("yersinia-plasmid"), 64, 4, objective="clm")
    collate = RemoveColumnsCollator(default_data_collator, columns)
    batch = collate([dataset[i] for i in range(4)])
    assert set(batch) == {"input_ids", "labels"}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])  # as a tokenizer's collator adds it
    outputs = model(**batch)
    assert isinstance(outputs, dict) and outputs["loss"] is outputs[0] and torch.isfinite(outputs["loss"])
    predictions = tuple(v for k, v in outputs.items() if k != "loss")  # Trainer.prediction_step
    assert len(predictions) == 1 and predictions[0].shape == (4, 64, 9)
    outputs["loss"].backward()


def test_dna_lm_trains_under_the_trainer(tmp_path):
    """The Trainer itself (it needs accelerate, which transformers[torch] installs): a few steps lower the
    loss, evaluation reports eval_loss, predict returns the logits."""
    pytest.importorskip("accelerate")
    from genoflash.data import GenomeWindowDataset, example_fasta

    model = _tiny_dna_lm()
    fasta = example_fasta("yersinia-plasmid")
    train = GenomeWindowDataset(fasta, 64, 64, objective="clm", seed=0, index_dir=tmp_path / "fai")
    held_out = GenomeWindowDataset(fasta, 64, 8, objective="clm", seed=1, index_dir=tmp_path / "fai")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=12, per_device_train_batch_size=8,
                                          per_device_eval_batch_size=8, learning_rate=3e-3, logging_steps=1,
                                          save_strategy="no", report_to=[], use_cpu=True, seed=0,
                                          dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=held_out)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    after = trainer.evaluate()["eval_loss"]
    assert after < before  # from a uniform guess (ln 9) towards the plasmid's base frequencies
    prediction = trainer.predict(held_out)
    assert prediction.predictions.shape == (8, 64, 9) and prediction.label_ids.shape == (8, 64)
