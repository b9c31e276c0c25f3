# summary of the prefill-chunk debug log (HITL_LOG) of the long prompt, by context band (spread: layers over iterations)
import json,collections,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if '"prefill chunk"' in l]
reqs=collections.Counter(r['request'] for r in rows)
longreq=max(reqs,key=lambda k:max(r['context'] for r in rows if r['request']==k))
L=[r for r in rows if r['request']==longreq]
print(len(rows),'chunks;',len(L),'of the long prompt, max context',L[-1]['context'],'; beside decoding:',sum(r['decoding'] for r in L),'; spread over iterations:',sum(r.get('spread',False) for r in L))
def q(v,p): v=sorted(v); return v[min(len(v)-1,int(p*len(v)))]
print("| context | chunks | spread | tokens p50 (min-max) | chunk took p50 / p90 / p99 ms | spread chunk's layer share p50 / p99 ms | fitted F p50 ms | decode step p50 ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for lo in range(0,33000,4096):
  b=[r for r in L if lo<=r['context']<lo+4096 and r['decoding']]
  if not b: continue
  t=[r['took']/1e6 for r in b]; n=[r['tokens'] for r in b]
  sp=[r['took']/1e6/6 for r in b if r.get('spread')]
  Fs=[r['fixed_cost']/1e6 for r in b]
  sps=f"{q(sp,.5):.1f} / {q(sp,.99):.1f}" if sp else "-"
  print(f"| {lo}-{lo+4096} | {len(b)} | {len(sp)} | {q(n,.5)} ({min(n)}-{max(n)}) | {q(t,.5):.1f} / {q(t,.9):.1f} / {q(t,.99):.1f} | {sps} | {q(Fs,.5):.1f} | {q([r['decode_step']/1e6 for r in b],.5):.1f} |")
