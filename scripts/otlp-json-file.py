#!/usr/bin/env python3
"""Writes N infertrace-dialect requests (4 spans each: the request, queue, prefill, decode) as
OTLP/JSON to stdout: `whole` as one export request, `lines` as one per 100 requests a line.
The input of the `analyze` figures in docs/PERFORMANCE.md:

    python3 scripts/otlp-json-file.py 200000 whole > whole.json
    /usr/bin/time -f "%e s %M KB" infertrace analyze whole.json --format json > /dev/null
"""
import json, sys
T0=1_700_000_000_000_000_000; MS=1_000_000
def req(i):
    q,p,d = [(10,40,200),(30,60,400),(5,20,100)][i%3]
    tr=f"{0xabc0+i:032x}"; root=f"{0x100+i*16:016x}"
    st=T0+i*10*MS; s=st+q*MS; f=s+p*MS; e=f+d*MS
    a=lambda k,v:{"key":k,"value":v}
    sp=[{"traceId":tr,"spanId":root,"name":"chat m","kind":2,"startTimeUnixNano":str(st),"endTimeUnixNano":str(e),
        "attributes":[a("gen_ai.operation.name",{"stringValue":"chat"}),a("gen_ai.request.model",{"stringValue":"m"}),
        a("gen_ai.usage.input_tokens",{"intValue":"100"}),a("gen_ai.usage.output_tokens",{"intValue":"11"}),a("infer.outcome",{"stringValue":"ok"})],"status":{}}]
    for n,(name,x,y) in enumerate([("queue",st,s),("prefill",s,f),("decode",f,e)]):
        sp.append({"traceId":tr,"spanId":f"{0x100+i*16+n+1:016x}","parentSpanId":root,"name":name,"kind":1,
          "startTimeUnixNano":str(x),"endTimeUnixNano":str(y),"attributes":[a("infer.phase",{"stringValue":name})]})
    return sp
n=int(sys.argv[1]); whole=sys.argv[2]=="whole"
def doc(spans): return {"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},"scopeSpans":[{"scope":{"name":"t"},"spans":spans}]}]}
if whole:
    spans=[]
    for i in range(n): spans+=req(i)
    json.dump(doc(spans), sys.stdout)
else:
    for b in range(0,n,100):
        spans=[]
        for i in range(b,min(n,b+100)): spans+=req(i)
        print(json.dumps(doc(spans)))
