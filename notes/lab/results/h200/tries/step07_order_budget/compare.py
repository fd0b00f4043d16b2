#!/usr/bin/env python3
"""The order-budget run (README.md beside this): per causal shape, production ÷ the same kernel head after head
with sections from 40 MiB and from 16.7 MB, their ratio, and production × cuDNN with each.  python3 compare.py"""
import csv,collections,statistics,sys
def load(f):
    d=collections.defaultdict(list)
    for r in csv.DictReader(open(f)):
        impl=r['step'] if r['impl']=='fa' else r['impl']
        d[(int(r['B'])*int(r['H'])*int(r['N']),int(r['d']),int(r['N']),impl)].append(float(r['ms']))
    return {k:statistics.median(v) for k,v in d.items()}
for dr,base in (('ab07','h'),('ab07bwd','07b12')):
    a=load(f'{dr}_order_l2_60mb.csv'); b=load(f'{dr}_order_l2_25mb.csv')
    print(dr)
    eff=collections.defaultdict(list)
    for k in sorted(set(k[:3] for k in a)):
        bs = base if base!='h' else ('07h7' if k[1]==256 else '07h9')
        ra=a[k+(bs,)]/a[k+('07',)]; rb=b[k+(bs,)]/b[k+('07',)]
        ca=a[k+('torch-cudnn',)]/a[k+('07',)]; cb=b[k+('torch-cudnn',)]/b[k+('07',)]
        eff[k[1]].append(rb/ra)
        print(k, 'vs head-major: 40MB %.3f 16.7MB %.3f  | budget effect %.3f | x cudnn %.3f %.3f'%(ra,rb,rb/ra,ca,cb))
    for dd,v in sorted(eff.items()): print(' d=%d: smaller sections ÷ production %.2f–%.2f'%(dd,min(v),max(v)))
