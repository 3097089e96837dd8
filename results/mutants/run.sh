#!/usr/bin/env bash
# Each mutant: a python replace on pamagrpo.py; run the math tests; expect failures; restore.
cd /work/main
cp pamagrpo.py /tmp/pamagrpo.orig
run() {  # name, old, new
  python - "$2" "$3" <<'PY'
import sys
t=open("pamagrpo.py").read(); old,new=sys.argv[1],sys.argv[2]
assert t.count(old)==1,(old,t.count(old)); open("pamagrpo.py","w").write(t.replace(old,new))
PY
  out=$(HF_HUB_OFFLINE=1 nice python -m pytest -q -p no:cacheprovider test_all.py -k "hand_computed_loss or decision_loss or kl_and_entropy or credit or advantages or align or decision_start" 2>&1 | tail -1)
  echo "$1: $out"
  cp /tmp/pamagrpo.orig pamagrpo.py
}
run "KL sign" "- cfg.entropy_coef * entropy, kl, entropy, ratio" "- cfg.entropy_coef * entropy - 2 * cfg.kl_coef * kl, kl, entropy, ratio"
run "KL direction" "kl = torch.sum(p * (logp - base_logp))" "kl = torch.sum(base_logp.exp() * (base_logp - logp))"
run "clip" "torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * advantage)" "ratio * advantage)"
run "credit time offset" "total = at(step.rollout, 0 if mode == \"episode\" else step.t)" "total = at(step.rollout, 0 if mode == \"episode\" else step.t + 1)"
run "advantages pooled over agents" "and i in (None, st.agent)]" "]"
run "advantage without std" "float((st.ret - mean) / (std + eps))" "float(st.ret - mean)"
run "loss not a mean over D_i" "terms.append(loss / count[n])" "terms.append(loss)"
cmp pamagrpo.py /tmp/pamagrpo.orig && echo restored
