"""genoflash score: per-base log-likelihoods and variant log-likelihood ratios from a DNA LM, against
forward passes computed here one window at a time; bad records, the CLI, and output that is whole
or absent."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from genoflash.data import FastaFile
from genoflash.data.tokenizer import encode
from genoflash.data.vcf import Variant, read_variants
from genoflash.inference import score_bases, score_variants
from genoflash.inference import cli
from genoflash.inference.score import base_windows
from genoflash.models import DNALM, DNALMConfig, save_pretrained


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    rng = random.Random(5)
    seqs = {"chrA": "".join(rng.choice("ACGT") for _ in range(301)), "chrB": "".join(rng.choice("ACGT") for _ in range(97))}
    path = tmp_path_factory.mktemp("genome") / "g.fa"
    path.write_text("".join(f">{name}\n{seq}\n" for name, seq in seqs.items()))
    return path, seqs


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DNALM(DNALMConfig(dim=32, depth=2, nheads=2, layer_pattern="LG", window_size=16)).eval()


def direct(model, sequence: str) -> np.ndarray:
    """log P(s[i] | s[:i]) for i >= 1 from one forward pass of the whole sequence (index 0: NaN)."""
    with torch.no_grad():
        tokens = encode(sequence)[None]
        logp = torch.log_softmax(model(tokens)["logits"].float(), -1)[0, :-1]
        return np.concatenate([[math.nan], logp.gather(-1, tokens[0, 1:, None])[:, 0].double().numpy()])


@pytest.mark.parametrize("start,end,context,stride", [(0, 301, 301, 300), (0, 301, 64, 24), (17, 129, 40, 1),
                                                      (0, 1, 8, 4), (5, 5, 8, 4)])
def test_windows_score_each_base_once_with_its_context(start, end, context, stride):
    targets = []
    for a, t0, t1 in base_windows(301, start, end, context, stride):
        assert t1 - a <= context and t0 >= a + 1
        for t in range(t0, t1):
            assert t - a >= min(t, context - stride)  # the context every base is promised
            targets.append(t)
    assert targets == list(range(max(start, 1), end))


@pytest.mark.parametrize("context,stride,batch_size", [(301, 300, 8), (64, 24, 3), (40, 39, 1)])
def test_per_base_loglik_is_the_models_on_each_window(genome, model, context, stride, batch_size):
    path, seqs = genome
    fasta = FastaFile(path)
    regions = [("chrA", 0, 301), ("chrB", 10, 97)]
    got = list(score_bases(model, fasta, regions, context, stride, batch_size, torch.device("cpu")))
    expected = []
    for chrom, start, end in regions:
        for a, t0, t1 in base_windows(len(seqs[chrom]), start, end, context, stride):
            ll = direct(model, seqs[chrom][a:t1])
            expected += [(chrom, t, seqs[chrom][t], ll[t - a]) for t in range(t0, t1)]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    np.testing.assert_allclose([g[3] for g in got], [e[3] for e in expected], rtol=1e-5, atol=1e-5)
    if context == 301:  # one window: the whole chromosome's forward pass
        np.testing.assert_allclose([g[3] for g in got if g[0] == "chrA"], direct(model, seqs["chrA"])[1:],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_cache", [None, False])
def test_variant_llr_is_the_alt_minus_ref_likelihood_from_the_site_on(genome, model, tmp_path, kv_cache):
    path, seqs = genome
    a = seqs["chrA"]
    swap = {"A": "C", "C": "G", "G": "T", "T": "A"}
    vcf = tmp_path / "calls.vcf"
    vcf.write_text("##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\n"
                   f"chrA\t151\trs1\t{a[150]}\t{swap[a[150]]},{swap[swap[a[150]]]}\n"   # multi-allelic
                   f"chrA\t1\tfirst\t{a[0]}\t{swap[a[0]]}\n"                             # no base before it
                   f"chrA\t300\tmnv\t{a[299:301]}\t{swap[a[299]]}{swap[a[300]]}\n"         # at the end
                   f"chrA\t20\tbad_ref\t{swap[a[19]]}\t{a[19]}\n"
                   f"chrA\t30\tindel\t{a[29]}\t{a[29]}A\n"
                   "chrZ\t5\tnowhere\tA\tC\n"
                   "chrA\tten\tbroken\tA\tC\n"
                   "chrA\t40\tsymbolic\tA\t<DEL>\n"
                   "a line that is not a record\n")
    variants, skipped = read_variants(vcf)
    assert [s.where for s in skipped] == ["calls.vcf:9", "calls.vcf:10", "calls.vcf:11"]
    assert skipped[0].reason == "a position is not an integer: 'ten'"
    assert "ALT '<DEL>'" in skipped[1].reason
    assert skipped[2].reason == "not a VCF record: 1 tab-separated fields, need 5"
    context = 64
    results = list(score_variants(model, FastaFile(path), variants, context, 2, torch.device("cpu"),
                                  kv_cache=kv_cache))
    assert [r.variant.id for r in results] == ["rs1", "rs1", "first", "mnv", "bad_ref", "indel", "nowhere"]
    assert [r.status.split(":")[0] for r in results] == ["ok", "ok", "ok", "ok", "REF mismatch", "indel",
                                                         "chromosome 'chrZ' is not in the FASTA"]
    for r in results[:4]:
        v = r.variant
        end = min(301, v.end + context // 2)
        start = max(0, end - context)
        ref_window = a[start:end]
        alt_window = ref_window[:v.pos - start] + v.alt + ref_window[v.end - start:]
        diff = direct(model, alt_window)[v.pos - start:] - direct(model, ref_window)[v.pos - start:]
        assert r.llr == pytest.approx(float(np.nansum(diff)), abs=1e-4)
        assert r.llr != 0
    assert math.isnan(results[4].llr)


def test_variants_run_each_prefix_once_through_the_kv_cache(genome, model):
    """With the cache, a site's bases before the variant enter the model once, and every allele only
    its continuation; the LLRs equal the whole-window ones."""
    path, seqs = genome
    a, context = seqs["chrA"], 64
    swap = {"A": "C", "C": "G", "G": "T", "T": "A"}
    variants = [Variant("chrA", p, a[p], alt, f"s{p}") for p in (100, 101, 200)
                for alt in (swap[a[p]], swap[swap[a[p]]], swap[swap[swap[a[p]]]])]
    fed = []
    hook = model.embed.register_forward_hook(lambda m, args, out: fed.append(args[0].numel()))
    try:
        cached = list(score_variants(model, FastaFile(path), variants, context, 9, torch.device("cpu")))
        assert sum(fed) == 3 * (context - context // 2 - 1) + (3 + 9) * (context // 2 + 1)
        fed.clear()
        windows = list(score_variants(model, FastaFile(path), variants, context, 9, torch.device("cpu"),
                                      kv_cache=False))
        assert sum(fed) == (3 + 9) * context
    finally:
        hook.remove()
    np.testing.assert_allclose([r.llr for r in cached], [r.llr for r in windows], rtol=1e-4, atol=1e-4)
    assert all(r.status == "ok" and r.llr != 0 for r in cached)


def test_kv_cache_is_refused_for_a_model_without_one(genome):
    torch.manual_seed(0)
    hyena = DNALM(DNALMConfig(dim=32, depth=1, nheads=2, mixer="hyena", hyena_l_max=512)).eval()
    assert not hyena.supports_kv_cache
    path, seqs = genome
    variant = Variant("chrA", 100, seqs["chrA"][100], "A" if seqs["chrA"][100] != "A" else "C", "v")
    with pytest.raises(ValueError, match="kv_cache=True needs a causal LM of attention layers"):
        list(score_variants(hyena, FastaFile(path), [variant], 64, 2, torch.device("cpu"), kv_cache=True))
    (r,) = score_variants(hyena, FastaFile(path), [variant], 64, 2, torch.device("cpu"))  # whole windows
    assert r.status == "ok" and math.isfinite(r.llr)
    with pytest.raises(ValueError, match="a KV cache needs a causal LM of attention layers"):
        hyena.new_kv_cache(1, 8)


def test_bed_variants_and_bad_bed_records(tmp_path):
    bed = tmp_path / "v.bed"
    bed.write_text("chrA\t10\t11\tA>G\nchrA\t10\t12\tA>G\nchrA\t5\t6\tnoarrow\n")
    variants, skipped = read_variants(bed)
    assert variants == [Variant("chrA", 10, "A", "G")]
    assert [s.reason.split(" ")[0] for s in skipped] == ["REF", "the"]


def _cli(genome, model, tmp_path, *extra):
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        save_pretrained(model, model_dir)
    return cli.main(["--model", str(model_dir), "--fasta", str(genome[0]), "--context", "64", "--quiet", *extra])


def test_cli_writes_bedgraph_and_tsv(genome, model, tmp_path, capsys):
    out = tmp_path / "bases.bedgraph"
    assert _cli(genome, model, tmp_path, "--out", str(out)) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 300 + 96 and lines[0].startswith("chrA\t1\t2\t")
    assert not (tmp_path / "bases.bedgraph.partial").exists()
    assert '"bases": 396' in capsys.readouterr().out
    vcf = tmp_path / "v.vcf"
    vcf.write_text(f"chrB\t50\tx\t{genome[1]['chrB'][49]}\tN\n")
    tsv = tmp_path / "llr.tsv"
    assert _cli(genome, model, tmp_path, "--variants", str(vcf), "--out", str(tsv)) == 0
    header, row = tsv.read_text().splitlines()
    assert header.split("\t") == ["chrom", "pos", "id", "ref", "alt", "llr", "status"]
    assert row.split("\t")[:5] == ["chrB", "50", "x", genome[1]["chrB"][49], "N"] and row.endswith("\tok")


def test_cli_bad_input_is_one_line_and_writes_nothing(genome, model, tmp_path, capsys):
    assert _cli(genome, model, tmp_path, "--out", str(tmp_path / "x.txt")) == 2
    assert _cli(genome, model, tmp_path, "--out", str(tmp_path / "x.tsv"), "--stride", "64") == 2
    assert cli.main(["--model", str(tmp_path / "none"), "--fasta", str(genome[0]), "--out", str(tmp_path / "y.tsv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("genoflash score: error: ") for line in err)
    assert "suffix" in err[0] and "stride" in err[1] and "neither a training run" in err[2]
    assert not list(tmp_path.glob("*.tsv")) and not list(tmp_path.glob("x.*"))


def test_a_killed_run_leaves_no_output(genome, model, tmp_path, monkeypatch):
    def dies(*args, **kwargs):
        yield "chrA", 1, "A", -1.0
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "score_bases", dies)
    out = tmp_path / "bases.tsv"
    with pytest.raises(KeyboardInterrupt):
        _cli(genome, model, tmp_path, "--out", str(out))
    assert not out.exists() and not (tmp_path / "bases.tsv.partial").exists()
    monkeypatch.undo()
    assert _cli(genome, model, tmp_path, "--out", str(out)) == 0 and out.exists()
