"""Demo-recipe probe (2026-11-29): trains genoflash's SequenceClassifier on the synthetic long-range task
with its own minimal loop (AdamW, constant lr after 20 warm-up steps), on the CPU. Arguments are key=value
overrides of `kw` below; results are in benchmarks/results/cpu-2026-11-29-demo-probes.txt. A research
record, not part of the package: `genoflash demo` and `genoflash train` are the supported paths."""
import sys, time, torch, torch.nn.functional as F
torch.set_num_threads(1)
from genoflash.data.synthetic import SyntheticLongRangeDataset, MotifGrammar
from genoflash.data import CLS_ID
from genoflash.models.dna_lm import DNALMConfig
from genoflash.train.classifier import SequenceClassifier
kw = dict(fanin=0, embstd=0.0, gseed=-1, sites=1, spacer=0, L=256, d=128, w=16, fam=2, dim=64, depth=2, heads=4, steps=600, bs=16, lr=3e-3, seed=0, pat="G", pool="cls", mlen=16, stem=15, margin=48)
for a in sys.argv[1:]:
    k, v = a.split("="); kw[k] = type(kw[k])(v)
torch.manual_seed(kw["seed"])
g = MotifGrammar.random(n_families=kw["fam"], motif_length=kw["mlen"], seed=kw["seed"] if kw["gseed"] < 0 else kw["gseed"])
tr = SyntheticLongRangeDataset(kw["steps"] * kw["bs"], kw["L"], kw["d"], seed=kw["seed"], grammar=g, margin=kw["margin"], sites=kw["sites"], spacer=kw["spacer"])
te = SyntheticLongRangeDataset(256, kw["L"], kw["d"], seed=kw["seed"] + 99, grammar=g, margin=kw["margin"], sites=kw["sites"], spacer=kw["spacer"])
cfg = DNALMConfig(dim=kw["dim"], depth=kw["depth"], nheads=kw["heads"], layer_pattern=kw["pat"], window_size=kw["w"])
m = SequenceClassifier(cfg, stem_kernel=kw["stem"])
if kw["fanin"]:
    for mod in m.trunk.modules():
        if isinstance(mod, torch.nn.Linear): torch.nn.init.normal_(mod.weight, std=kw["fanin"] * mod.in_features ** -0.5)
if kw["embstd"]: torch.nn.init.normal_(m.trunk.embed.weight, std=kw["embstd"])
def fwd(tokens):
    if kw["pool"] == "cls":
        tokens = torch.cat([torch.full_like(tokens[:, :1], CLS_ID), tokens], 1)
        x, _ = m.hidden_states(tokens)
        return m.head(x[:, 0]).float()
    x, mask = m.hidden_states(tokens)
    return m.head(x.mean(1)).float()
opt = torch.optim.AdamW(m.parameters(), lr=kw["lr"], weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / 20))
Xte = torch.stack([te[i][0] for i in range(len(te))]); yte = torch.stack([te[i][1] for i in range(len(te))])
t0 = time.time(); out = []
for s in range(kw["steps"]):
    idx = range(s * kw["bs"], (s + 1) * kw["bs"])
    X = torch.stack([tr[i][0] for i in idx]); y = torch.stack([tr[i][1] for i in idx])
    loss = F.cross_entropy(fwd(X), y)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); sched.step()
    if (s + 1) % 50 == 0:
        m.eval()
        with torch.no_grad(): acc = (fwd(Xte).argmax(-1) == yte).float().mean().item()
        m.train(); out.append(f"{s+1}:{acc:.2f}")
print({k: v for k, v in kw.items() if any(a.startswith(k + "=") for a in sys.argv[1:])}, f"{time.time()-t0:.0f}s", " ".join(out), flush=True)
