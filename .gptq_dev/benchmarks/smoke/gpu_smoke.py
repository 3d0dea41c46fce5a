"""Early GPU smoke timing of the engine on the Llama-3.1-8B shape (dummy weights); not the benchmark."""
import sys, time
import torch
from brigade import LLM, SamplingParams

model = sys.argv[1]
llm = LLM(model, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048,
          max_num_seqs=256)
gen = torch.Generator().manual_seed(0)
def prompts(n, length):
    return [torch.randint(100, 120000, (length,), generator=gen).tolist() for _ in range(n)]
# latency: batch 1, 128 in, 256 out
p = prompts(1, 128)
llm.generate(p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
for _ in range(2):
    t = time.perf_counter(); llm.generate(p, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False); ttft = time.perf_counter() - t
    t = time.perf_counter(); llm.generate(p, SamplingParams(temperature=0, max_tokens=256, ignore_eos=True), use_tqdm=False); e2e = time.perf_counter() - t
    print(f"latency: e2e {e2e*1e3:.1f} ms, ttft {ttft*1e3:.1f} ms, tpot {(e2e-ttft)/255*1e3:.2f} ms", flush=True)
for n, il, ol in ((300, 1024, 128),):
    ps = prompts(n, il)
    t = time.perf_counter()
    outs = llm.generate(ps, SamplingParams(temperature=1.0, max_tokens=ol, ignore_eos=True), use_tqdm=False)
    dt = time.perf_counter() - t
    print(f"throughput {n}x{il}/{ol}: {n/dt:.2f} req/s, total {n*(il+ol)/dt:.0f} tok/s, output {n*ol/dt:.0f} tok/s", flush=True)
# Profile a few batch-1 decode steps: GPU kernel time vs wall time per step.
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    t = time.perf_counter()
    llm.generate(p, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    print(f"profiled 32 tokens: {(time.perf_counter()-t)*1e3:.1f} ms", flush=True)
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18), flush=True)
