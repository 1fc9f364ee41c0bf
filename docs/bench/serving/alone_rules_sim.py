"""A request alone under the verification budget, replayed without timing: the pool's rules for a new request
(issue 39, twenty-fourth session).

    .venv/bin/python docs/bench/serving/alone_rules_sim.py          # the served workload's prompts, 20 orders
    .venv/bin/python docs/bench/serving/alone_rules_sim.py iid      # made-up requests, each token drafted right
                                                                    # with chance q (0.4-0.7): requests alike

Concurrency 1 at one row bucket (2), in numpy: each request's exact draft matches (replay_matches.json, as
replay.py: at temperature 0 a draft token is accepted iff it is the target's), the device's estimate rule
(estimates.py, restated in `update`), and the library's own `budget.choose`, `AcceptancePrior`, `probes.SideRuns`
and `lookahead.drafts_first`, with the held plain plan (Budget.hold), the stick, the draft's wake and plain's settle,
charged from the AMD machine's warm-up curves at 2 rows (arms_ende_s69_amd_c1_c4.log; also with drafting 0.856 of
them, as its served gamma-4 steps cost). Requests come in a random order per seed (the engine's benchmarks serve
them in the file's order: arms_in_process.py --cost_model runs the engine itself). Rules for a request that has
verified nothing: base (the pool's mean), aging (the pool decays on every request that never drafted), perreq (each
request one weighted verdict per position), ucbZ (the mean plus Z standard errors over the requests counted),
robZ (plus Z standard errors of the requests' own means), optimist (at least the fixed prior, 0.8), look
(lookahead.py: one drafting step weighed over the last served requests).
"""
import json, os, sys
import numpy as np
from jaxspec.serving import budget as B
from jaxspec.decoding.device import estimates as E
from jaxspec.serving.lookahead import drafts_first
from jaxspec.serving.probes import SideRuns

HERE = os.path.dirname(os.path.abspath(__file__))
V = json.load(open(os.path.join(HERE, "replay_matches.json")))
G, I, MAXT = 4, 4, 64
TIERS = (0, 1, 2, 4)
WARM = {0: 34.14, 1: 62.13, 2: 72.08, 4: 87.72}  # AMD rows 2
SETTLE = 4.79
WAKE = 2.0

def update(bs, ct, prior, drafted, accepted, beta):
  j = np.arange(G)
  ver = j < min(accepted + 1, drafted)
  ps = E.PRIOR_COUNT * prior
  nbs = np.where(ver, E.DECAY * bs + beta, E.RELAX * bs + (1 - E.RELAX) * ps)
  nct = np.where(ver, E.DECAY * ct + 1.0, E.RELAX * ct + (1 - E.RELAX) * E.PRIOR_COUNT)
  return nbs, nct

def run(policy, seed, true_scale=1.0, rule="base", requests=192, start=None, hold=4, probe=0.02):
  rng = np.random.default_rng(seed)
  order = list(rng.permutation(len(V))) * (requests // len(V) + 1)
  order = order[:requests]
  true = {k: WARM[k] * (true_scale if k else 1.0) for k in TIERS}
  pool = B.AcceptancePrior.start(G)
  if start is not None: pool.START = start
  ends = B.EndRate()
  reqs = np.zeros(G)
  rw, rx, rx2 = np.zeros(G), np.zeros(G), np.zeros(G)
  runs = SideRuns(share=probe)
  ms, given, plain_steps, last_k = 0.0, 0, 0, None
  for idx in order:
    m = V[idx]
    prior = pool.alpha.astype(np.float64) if policy == "budget" else np.full(G, 0.8)
    bs, ct = E.PRIOR_COUNT * prior, np.full(G, E.PRIOR_COUNT)
    p, prev, held, behind, drafted_ever = 0, None, 0, False, False
    while p < len(m):
      if policy == "plain": k = 0
      elif policy == "fixed": k = 4
      else:
        probed = runs.probing(2)
        if probed is not None:
          k = TIERS[probed]
          lim = int(B.tier_limits(np.clip(bs / ct, 0, 1)[None], k, 0.2)[0]) if k else 0
          if k and not lim: k = 0
        elif held > 0:
          k, held = 0, held - 1
        else:
          alpha = np.clip(bs / ct, 0, 1)[None]
          if rule == "optimist" and not drafted_ever:
            alpha = np.maximum(alpha, E.PRIOR_ALPHA)
          if rule.startswith("ucb") and not drafted_ever:
            z = float(rule[3:] or 1)
            mu = pool.alpha.astype(np.float64)
            alpha = np.minimum(1.0, mu + z * np.sqrt(mu * (1 - mu) / (reqs + 2.0)))[None]
          if rule.startswith("rob") and not drafted_ever:
            z = float(rule[3:] or 1)
            mu = pool.alpha.astype(np.float64)
            W = rw + 2.0
            mean = (rx + 2.0 * mu) / W
            var = np.maximum((rx2 + 2.0 * (mu * mu + mu * (1 - mu))) / W - mean * mean, 0.0)
            alpha = np.minimum(1.0, mu + z * np.sqrt(var / W))[None]
          L = p + B.within(np.array([MAXT - p]), np.array([ends.rate]))[0]
          ch = B.choose(alpha, TIERS, [WARM[t] / 1000 for t in TIERS], 0.2, left=np.array([MAXT - p]), iterations=I,
                        behind=np.array([behind]), catchup=0.0, hazard=np.array([ends.rate]),
                        current=prev, stick=0.1,
                        per_token=None if drafted_ever else np.array([WAKE / 1000 / max(L, 1)]),
                        settle=SETTLE / 1000 if last_k == 0 else 0.0)
          if rule == "look" and ch.k == 0 and not drafted_ever:
            if drafts_first(pool.recent, ch.other, TIERS, [WARM[t] / 1000 for t in TIERS], 0.2, I, p, MAXT - p):
              ch = ch.other
          cur = runs.current(prev)
          pr = runs.due(2, ch, 0.0)
          if pr is not None:
            runs.start(2, ch, pr, cur); ch = pr
          elif ch.k == 0 and hold: held = hold
          k, lim = ch.k, (int(ch.limits[0]) if ch.k else 0)
      if policy != "budget": lim = k
      kk = lim
      its = 0
      for _ in range(I):
        if p >= len(m): break
        its += 1
        n = 0
        while n < kk and p + n < len(m) and m[p + n]: n += 1
        beta = np.array([float(m[p + j]) if p + j < len(m) else 1.0 for j in range(G)])
        p += min(n + 1, len(m) - p)
        if policy == "budget":
          bs, ct = update(bs, ct, prior, kk, n, beta)
      ms += true[k] * its / I + (WAKE if kk and not drafted_ever else 0.0)
      runs.ran(2, k, true[k] * its / I / 1000)
      if kk: drafted_ever = True
      if k == 0: plain_steps += 1
      prev = TIERS.index(k)
      last_k = k
      behind = kk == 0
    given += len(m)
    ends.observe(len(m), len(m) < MAXT)
    if policy == "budget":
      if rule == "aging" and not drafted_ever:
        pool.beta_sum *= pool.DECAY; pool.count *= pool.DECAY
      seen = E.observed(bs, ct, prior)[1]
      if seen.max() >= 1e-3:
        reqs = pool.DECAY * reqs + np.minimum(1.0, np.maximum(seen, 0))
        ss = E.observed(bs, ct, prior)[0]
        has = seen >= 0.5
        x = np.where(has, np.clip(ss / np.maximum(seen, 1e-9), 0, 1), 0.0)
        rw = pool.DECAY * rw + has; rx = pool.DECAY * rx + x * has; rx2 = pool.DECAY * rx2 + x * x * has
      if rule == "perreq":
        ss, sn = E.observed(bs, ct, prior)
        sn = np.maximum(sn, 0.0)
        if sn.max() >= 1e-3:
          w = np.minimum(1.0, sn / E.PRIOR_COUNT)
          x = np.clip(ss / np.maximum(sn, 1e-9), 0, 1)
          pool.beta_sum = pool.DECAY * pool.beta_sum + w * x
          pool.count = pool.DECAY * pool.count + w
      else:
        pool.observe(bs, ct, prior, len(m))
    ms += 4.5
  return given / ms, plain_steps

RULES = ("base", "aging", "perreq", "ucb1", "ucb0.5", "rob1", "rob2", "optimist", "look")


def main():
  global V
  if sys.argv[1:] == ["iid"]:
    rng, lengths = np.random.default_rng(1), [len(v) for v in V]
    for q in (0.4, 0.5, 0.6, 0.7):
      V = [[int(x) for x in (rng.random(n) < q)] for n in lengths]
      res = {rule: np.mean([run("budget", s, 1.0, rule)[0] for s in range(10)]) for rule in RULES}
      plain = np.mean([run("plain", s)[0] for s in range(10)])
      fixed = np.mean([run("fixed", s)[0] for s in range(10)])
      print(f"q={q}: fixed/plain {fixed / plain:.3f}; " + ", ".join(f"{r} {v / plain:.3f}" for r, v in res.items()))
    return
  for scale in (1.0, 2.2 / 2.57):
    print(f"drafting at {scale:.3f} of the curves (tokens/s of the model; / plain; / the better of plain and fixed; "
          f"plain steps)")
    runs = {(pol, rule): [run(pol, s, scale, rule) for s in range(20)]
            for pol, rule in [("plain", "base"), ("fixed", "base")] + [("budget", r) for r in RULES]}
    mean = {key: (np.mean([v[0] for v in vals]), np.mean([v[1] for v in vals])) for key, vals in runs.items()}
    plain, fixed = mean[("plain", "base")][0], mean[("fixed", "base")][0]
    for key, (r, steps) in mean.items():
      print(f"  {key[0]:6s} {key[1]:8s} {r * 1000:6.1f}  {r / plain:.3f}  {r / max(plain, fixed):.3f}  {steps:.0f}")


if __name__ == "__main__":
  main()
