#!/usr/bin/env python3
"""Summarizes cluster-generate-ab.sh output: per build, the counted rounds
(round 0 dropped) of in-process and cluster decode tokens/s, their
same-round ratio, and the cluster runs A over B pair by pair."""
import json, sys, statistics as st
from collections import defaultdict
rows=[]
for l in open(sys.argv[1]):
    try: rows.append(json.loads(l))
    except Exception: pass
t=defaultdict(dict)
for r in rows:
    d=r['d']; t[r['ab']].setdefault(r['round'],{})[d['run']]=d
ref=None
for ab in sorted(t):
    ip,ad,ra=[],[],[]
    toks=set()
    for rd in sorted(t[ab]):
        v=t[ab][rd]
        if 'inproc' not in v or 'addr' not in v: continue
        a,b=v['inproc'],v['addr']
        toks.add(tuple(a['tokens'])); toks.add(tuple(b['tokens']))
        ref = ref or a['tokens']
        if rd==0: continue
        x,y=a['tokens_per_s'],b['tokens_per_s']
        ip.append(x); ad.append(y); ra.append(y/x)
    if not ip: continue
    print(ab, 'n=%d'%len(ip), 'same tokens' if len(toks)==1 and list(toks)[0]==tuple(ref) else 'TOKENS DIFFER %d'%len(toks))
    print('  inproc', ' '.join('%.0f'%x for x in ip), 'median %.1f'%st.median(ip))
    print('  addr  ', ' '.join('%.0f'%x for x in ad), 'median %.1f'%st.median(ad))
    print('  ratio ', ' '.join('%.3f'%x for x in ra), 'median %.3f (%.3f-%.3f)'%(st.median(ra),min(ra),max(ra)))
# pairwise cluster A/B
if 'A' in t and 'B' in t:
    pr=[]
    for rd in sorted(t['A']):
        if rd==0: continue
        try: pr.append(t['A'][rd]['addr']['tokens_per_s']/t['B'][rd]['addr']['tokens_per_s'])
        except KeyError: pass
    if pr: print('cluster A/B pair by pair', ' '.join('%.2f'%x for x in pr), 'median %.2f'%st.median(pr))
