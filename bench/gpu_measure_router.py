"""Kernel launches and time of an MoE router's routing and aux-loss part, eager PyTorch, one GPU.

The ops of Megatron-Core's TopKRouter as NeMo 25.04 runs it (megatron/core/transformer/moe/
router.py ``gating`` / ``routing``; moe_utils.py ``router_gating_linear``,
``topk_softmax_with_capacity``, ``group_limited_topk``, ``sequence_load_balancing_loss_func``,
``switch_load_balancing_loss_func``), written out unfused, one PyTorch call each: ``R`` routes
(fp32 gating GEMM; sigmoid scores plus expert bias or softmax; group-limited top-k; gather,
normalization, scaling; scatters into probabilities and routing map; token counts; the aux
loss's own scores, top-k and map; the sequence or switch aux loss). The tp/cp all-reduce of
the aux loss is left out (one GPU). ``M`` counts the CUDA kernels of one forward and one
backward (torch.profiler), sums their device time, and times a forward and a forward+backward
with CUDA events (median of 20). Cases: DeepSeek-V3 (2,048 tokens, 256 experts, hidden 7,168,
8 groups keep 4, top-8, scaling 2.5) and a softmax top-2 router over 8 experts (Mixtral,
Grok-1; 4,096 tokens, hidden 6,144). Compact on purpose: the device run takes the script
inline.

Run: ``OUT=dir python bench/gpu_measure_router.py`` (writes dir/router.json; ~12 s on an H200).
Stored: bench/measured/h200-2026-11-26-router.json.
"""
import torch,json,statistics as S
T=torch
def R(x,w,b,k,G,K,sc,sg,s):
 l=T.mm(x.float(),w.float().t());n,e=l.shape
 if sg:p=T.sigmoid(l);c=p+b
 else:p=T.softmax(l,-1,dtype=T.float32);c=p
 if G>1:
  g=c.view(n,G,-1).topk(2,dim=-1)[0].sum(-1);gi=T.topk(g,k=K,dim=-1,sorted=False)[1]
  m=T.zeros_like(g).scatter(1,gi,1).unsqueeze(-1).expand(n,G,e//G).reshape(n,-1);c=c.masked_fill(~m.bool(),float("-inf"))
 i=T.topk(c,k=k,dim=-1)[1];q=T.gather(p,1,i)
 if sg:q=q/(q.sum(-1,keepdim=True)+1e-20)
 q=q*sc;rp=T.zeros_like(l).scatter(1,i,q);rm=T.zeros_like(l).int().scatter(1,i,1).bool();tp=rm.sum(0)
 if sg:a=T.sigmoid(l);a=a/(a.sum(-1,keepdim=True)+1e-20)
 else:a=T.softmax(l,-1,dtype=T.float32)
 j=T.topk(a,k=k,dim=1)[1];am=T.zeros_like(l).int().scatter(1,j,1).bool()
 if sg:co=am.reshape(s,1,e).sum(0).float()*(e/(s*k));ax=(co*a.reshape(s,1,e).mean(0)).sum(1).mean()*1e-4
 else:ax=T.sum(a.sum(0)*am.sum(0))*(e*1e-2/(n*n*k))
 return rp+0*ax,tp
def M(nm,n,e,h,k,G,K,sc,sg):
 x=T.randn(n,h,device="cuda",dtype=T.bfloat16,requires_grad=True);w=(T.randn(e,h,device="cuda",dtype=T.bfloat16)*.02).requires_grad_()
 b=T.zeros(e,device="cuda");gr=T.randn(n,e,device="cuda");f=lambda:R(x,w,b,k,G,K,sc,sg,n)
 def st():f()[0].backward(gr)
 for _ in range(5):st()
 T.cuda.synchronize();o={"name":nm,"tokens":n,"experts":e,"hidden":h,"topk":k}
 A=[T.profiler.ProfilerActivity.CUDA]
 with T.profiler.profile(activities=A) as P:
  pr=f()[0];T.cuda.synchronize()
 K1=[v for v in P.events() if v.device_type==T.autograd.DeviceType.CUDA];o["forward_kernels"]=len(K1);o["forward_kernel_s"]=sum(v.device_time_total for v in K1)*1e-6
 with T.profiler.profile(activities=A) as P:
  pr.backward(gr);T.cuda.synchronize()
 K1=[v for v in P.events() if v.device_type==T.autograd.DeviceType.CUDA];o["backward_kernels"]=len(K1);o["backward_kernel_s"]=sum(v.device_time_total for v in K1)*1e-6
 for lb,fn in(("forward_s",f),("step_s",st)):
  t=[]
  for _ in range(20):
   a0=T.cuda.Event(enable_timing=True);a1=T.cuda.Event(enable_timing=True);a0.record();fn();a1.record();T.cuda.synchronize();t.append(a0.elapsed_time(a1)*1e-3)
  o[lb]=S.median(t)
 return o
r={"torch":T.__version__,"gpu":T.cuda.get_device_name(),"cases":[M("dsv3",2048,256,7168,8,8,4,2.5,True),M("softmax-top2",4096,8,6144,2,1,1,1.,False)]}
import os;json.dump(r,open(os.environ["OUT"]+"/router.json","w"),indent=1);print(json.dumps(r))
