"""Compare two fingerprint folders (before/after): adapters bitwise, records equal apart from clocks."""
import hashlib, json, os, sys
A, B = sys.argv[1], sys.argv[2]
def strip(r):
    return {k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith("seconds") and k != "train_s"}
ok = True
for run in sorted(d for d in os.listdir(A) if os.path.isdir(os.path.join(A, d)) and d != "cache"):
    a, b = os.path.join(A, run), os.path.join(B, run)
    tensors = 0
    for root, _, files in os.walk(a):
        for f in files:
            if f.endswith(".safetensors") or f == "optimizers.pt":
                pa = os.path.join(root, f); pb = os.path.join(b, os.path.relpath(pa, a))
                ha = hashlib.sha256(open(pa, "rb").read()).hexdigest()
                hb = hashlib.sha256(open(pb, "rb").read()).hexdigest() if os.path.exists(pb) else None
                tensors += 1
                if ha != hb and f != "optimizers.pt":
                    ok = False; print("DIFF", run, os.path.relpath(pa, a))
                elif ha != hb:
                    print("note: optimizer file bytes differ (pickled)", run, os.path.relpath(pa, a))
    for name in ("metrics.jsonl", "eval.jsonl"):
        ra = [strip(json.loads(l)) for l in open(os.path.join(a, name))]
        rb = [strip(json.loads(l)) for l in open(os.path.join(b, name))]
        if ra != rb:
            ok = False; print("DIFF", run, name)
    for name in ("result.json", "audit_final.json"):
        if os.path.exists(os.path.join(a, name)):
            ra, rb = (strip(json.load(open(os.path.join(d, name)))) for d in (a, b))
            if ra != rb: ok = False; print("DIFF", run, name)
    for name in ("replay.txt",):
        if open(os.path.join(a, name)).read() != open(os.path.join(b, name)).read(): ok = False; print("DIFF", run, name)
    print(f"{run}: {tensors} adapter/optimizer files compared")
print("IDENTICAL" if ok else "DIFFERENT")
