# summary of the prefill-chunk debug log (HITL_LOG) of the long prompt, by context band
import json,collections,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if '"prefill chunk"' in l]
reqs=collections.Counter(r['request'] for r in rows)
longreq=max(reqs,key=lambda k:max(r['context'] for r in rows if r['request']==k))
L=[r for r in rows if r['request']==longreq]
print(len(rows),'chunks;',len(L),'of the long prompt, max context',L[-1]['context'],'; beside decoding:',sum(r['decoding'] for r in L))
def q(v,p): v=sorted(v); return v[min(len(v)-1,int(p*len(v)))]
def fit(n,t):
  m=len(n); mn=sum(n)/m; mt=sum(t)/m
  vn=sum((x-mn)**2 for x in n)
  c1=sum((x-mn)*(y-mt) for x,y in zip(n,t))/vn if vn>0 else 0
  return mt-c1*mn,c1
print("| context | chunks | tokens p50 (min-max) | took p50 / p90 / p99 / max ms | fitted F p50 ms | decode step p50 ms | least squares in band: took = c0 + c1 x tokens |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for lo in range(0,33000,4096):
  b=[r for r in L if lo<=r['context']<lo+4096 and r['decoding']]
  if not b: continue
  t=[r['took']/1e6 for r in b]; n=[r['tokens'] for r in b]
  c0,c1=fit(n,t)
  Fs=[r['fixed_cost']/1e6 for r in b]
  print(f"| {lo}-{lo+4096} | {len(b)} | {q(n,.5)} ({min(n)}-{max(n)}) | {q(t,.5):.1f} / {q(t,.9):.1f} / {q(t,.99):.1f} / {max(t):.1f} | {q(Fs,.5):.1f} | {q([r['decode_step']/1e6 for r in b],.5):.1f} | {c0:.1f} + {c1:.2f} n |")
