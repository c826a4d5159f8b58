"""(numpy; not part of any build or test: the prediction behind SELKV_DECODE_F16_PARTIALS, docs/perf-log.md session 9)
Cosine distance of split-KV decode outputs against the fp64 reference (the test's compare():
out vs bf16(ref)) for three partial formats: fp32, bf16, fp16 with a power-of-two scale.
Models the kernel's roundings: P -> bf16 for P V, partial O/l -> format, final out -> bf16."""
import numpy as np

def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)

def f16_scaled(x):  # per row (head) half: max -> [2^13, 2^14)
    out = np.empty_like(x)
    for half in (slice(0, 256), slice(256, 512)):
        m = np.abs(x[:, half]).max(axis=1, keepdims=True)
        e = np.floor(np.log2(np.maximum(m, 1e-38)))
        s = np.exp2(13 - e)
        out[:, half] = (x[:, half] * s).astype(np.float16).astype(np.float32) / s
    return out

def run(seed, H=64, K=2048, splits=16, std=0.1):
    rng = np.random.default_rng(seed)
    q = bf16(rng.standard_normal((H, 576)))
    kv = bf16(rng.standard_normal((K, 576)) * std)
    scale = 576 ** -0.55
    s = (q.astype(np.float64) @ kv.T.astype(np.float64)) * scale
    # reference
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    ref = (p @ kv[:, :512].astype(np.float64)) / p.sum(axis=1, keepdims=True)
    r = bf16(ref)
    res = {}
    for fmt in ("fp32", "bf16", "fp16s"):
        parts, lses = [], []
        for c in np.array_split(np.arange(K), splits):
            sc = s[:, c].astype(np.float32)
            mc = sc.max(axis=1, keepdims=True)
            pc = np.exp(sc - mc).astype(np.float32)
            lc = pc.sum(axis=1, keepdims=True)
            oc = (bf16(pc).astype(np.float32) @ kv[c, :512].astype(np.float32)) / lc
            if splits > 1:
                oc = {"fp32": lambda v: v, "bf16": bf16, "fp16s": f16_scaled}[fmt](oc)
            parts.append(oc)
            lses.append(mc + np.log(lc))
        L = np.concatenate(lses, axis=1)
        mx = L.max(axis=1, keepdims=True)
        w = np.exp(L - mx)
        o = sum(w[:, i:i + 1] * parts[i] for i in range(splits)) / w.sum(axis=1, keepdims=True)
        x = bf16(o).astype(np.float64)
        rr = r.astype(np.float64)
        res[fmt] = 1 - 2 * (x * rr).sum() / ((x * x).sum() + (rr * rr).sum())
    return res

for splits in (2, 16, 32):
    for std in (0.1,):
        acc = {k: [] for k in ("fp32", "bf16", "fp16s")}
        for seed in range(6):
            for k, v in run(seed, splits=splits, std=std).items():
                acc[k].append(v)
        print(f"splits {splits:2d}: " + "  ".join(f"{k} mean {np.mean(v):.2e} max {np.max(v):.2e}" for k, v in acc.items()))
