"""Offline: label a loop trace's GPU kernels with the HLO op_names (scope) of the fusions they run."""
import collections, gzip, json, re, sys

def load_trace(path):
  t = json.load(gzip.open(path))
  ev = t['traceEvents'] if isinstance(t, dict) else t
  pn = {e['pid']: e['args']['name'] for e in ev if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  return sorted([e for e in ev if e.get('ph') == 'X' and 'GPU' in pn.get(e['pid'], '')], key=lambda e: e['ts'])

def op_names(hlo_path):
  names = {}
  for line in gzip.open(hlo_path, 'rt'):
    m = re.match(r'^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$', line)
    if not m:
      continue
    name, rest = m.groups()
    op = re.search(r'op_name="([^"]*)"', rest)
    op = op.group(1) if op else ''
    names.setdefault(name, op)
    d = re.search(r'deduplicated_name="([^"]*)"', rest)
    if d and op:
      names.setdefault(d.group(1), op)
  return names

def label(kname, names):
  op = names.get(kname.replace('_', '.'), None)
  if op is None:
    # kernel names: fusion_name with '.' -> '_' ; try a few forms
    base = re.sub(r'_(\d+)$', r'.\1', kname)
    op = names.get(base, names.get(kname, ''))
  cat = 'target' if 'target_step' in op else 'draft' if 'draft_step' in op else 'loop'
  return cat, op

if __name__ == '__main__':
  trace, hlo, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
  ks = load_trace(trace)
  names = op_names(hlo)
  by = collections.defaultdict(lambda: [0, 0.0])
  byop = collections.defaultdict(lambda: [0, 0.0])
  for e in ks:
    cat, op = label(e['name'], names)
    by[cat][0] += 1; by[cat][1] += e['dur']
    short = '/'.join(op.split('/')[-3:]) if op else e['name']
    byop[(cat, short)][0] += 1; byop[(cat, short)][1] += e['dur']
  span = ks[-1]['ts'] + ks[-1]['dur'] - ks[0]['ts']
  busy = sum(e['dur'] for e in ks)
  print(f'kernels {len(ks)}  span {span/1e3:.2f} ms  busy {busy/1e3:.2f} ms  iterations {iters}')
  for c, (n, t) in by.items():
    print(f'{c:7s} kernels/iter {n/iters:8.1f}  us/iter {t/iters:9.1f}')
  print('top loop ops per iteration:')
  for (c, s), (n, t) in sorted(byop.items(), key=lambda kv: -kv[1][1]):
    if c == 'loop':
      print(f'  {n/iters:6.1f} {t/iters:8.1f}us  {s[:110]}')
  # gaps
  gaps = [ks[i+1]['ts'] - (ks[i]['ts'] + ks[i]['dur']) for i in range(len(ks)-1)]
  big = sorted(((g, i) for i, g in enumerate(gaps)), reverse=True)[:15]
  print('largest gaps (us):', [(round(g, 1), ks[i]['name'][:30], ks[i+1]['name'][:30]) for g, i in big])
  print('sum of gaps > 5us per iteration:', sum(g for g in gaps if g > 5) / iters)
