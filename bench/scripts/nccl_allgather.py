"""NCCL all-gather latency through PyTorch: the anchor issue 17 compares
questrt's selection exchange with (the same bytes per rank, the same
machine).

Run on a multi-GPU host, one process per GPU:

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node N bench/scripts/nccl_allgather.py [--iters 200] [--sizes 1024,16384,262144,1048576]

Rank 0 prints one JSON line per size: bytes per rank, world size, and the
p50/p99 of the all-gather time in microseconds (CUDA events around each
call, after warm-up). NVLink multicast must stay off on the lent machines
(NVLS): the script refuses to run when NCCL_NVLS_ENABLE is not 0.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--sizes", default="1024,16384,262144,1048576", help="bytes per rank, comma-separated")
    args = ap.parse_args()
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        raise SystemExit("set NCCL_NVLS_ENABLE=0 (NVLink multicast is forbidden on these machines)")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    for size in (int(s) for s in args.sizes.split(",")):
        n = max(1, size // 4)
        x = torch.randn(n, device="cuda")
        out = [torch.empty_like(x) for _ in range(world)]
        for _ in range(args.warmup):
            dist.all_gather(out, x)
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dist.all_gather(out, x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        times.sort()
        if rank == 0:
            print(json.dumps({"bytes_per_rank": n * 4, "world": world, "iters": args.iters,
                              "p50_us": times[len(times) // 2], "p99_us": times[min(len(times) - 1, len(times) * 99 // 100)]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
