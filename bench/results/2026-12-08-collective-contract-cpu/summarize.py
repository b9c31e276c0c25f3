import sys,json,statistics as st
from collections import defaultdict
import os
exps=os.environ.get('EXP')
rows=[json.loads(l) for f in sys.argv[1:] for l in open(f)]
if exps: rows=[d for d in rows if str(d.get('h30_experiment')) in exps.split(',')]
g=defaultdict(list); builds=[]
for d in rows:
    g[(d['shards'],d['batch'],d['h30_build'])].append(d)
    if d['h30_build'] not in builds: builds.append(d['h30_build'])
print('| processes, batch | build | rounds | load before | ratio: median (range) | select p50 | baseline p50 | excess | start skew: select / baseline |')
print('|---|---|---|---|---|---|---|---|---|')
for key in sorted(set((d['shards'],d['batch']) for d in rows)):
    for b in builds:
        L=g[key+(b,)]
        if not L: continue
        r=[d['overhead_vs_baseline'] for d in L]; ld=[d['h30_load_before'] for d in L]
        m=lambda k: st.median(d[k] for d in L)
        ex=st.median(d['select_p50_us']-d['baseline_p50_us'] for d in L)
        bsk='%.0f'%m('baseline_start_skew_p50_us') if 'baseline_start_skew_p50_us' in L[0] else '-'
        print('| %d, %d | %s | %d | %.1f-%.1f | %.2f (%.2f-%.2f) | %.0f | %.0f | %.0f | %.0f / %s |'%(key[0],key[1],b,len(L),min(ld),max(ld),st.median(r),min(r),max(r),m('select_p50_us'),m('baseline_p50_us'),ex,m('start_skew_p50_us'),bsk))
